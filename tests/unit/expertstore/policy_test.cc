// policy.h: each policy's victim order on small hand-made sequences, the evictable filter, the
// pinned-layers decorator and the name table; next_use on the layer-cyclic scan that defeats LRU.
#include "expertstore/policy.h"

#include "expertstore/belady.h"
#include "gtest/gtest.h"

namespace moe::store {
namespace {

const auto kAny = [](ExpertId) { return true; };

TEST(Policy, LruEvictsLeastRecentlyUsed) {
  auto p = MakeLruPolicy();
  p->OnInsert({0, 1});
  p->OnInsert({0, 2});
  p->OnInsert({0, 3});
  p->OnAccess({0, 1});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 2}));
  // The filter is respected: a pinned expert is skipped.
  EXPECT_EQ(p->Victim([](ExpertId id) { return id.expert != 2; }), (ExpertId{0, 3}));
  p->OnErase({0, 2});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 3}));
  EXPECT_EQ(p->Victim([](ExpertId) { return false; }), std::nullopt);
}

TEST(Policy, WeightedLruKeepsFrequentExpertsThroughABurst) {
  // W = 10: expert 1, used 5 times, outlives several newer one-off experts.
  auto p = MakeWeightedLruPolicy(10);
  p->OnInsert({0, 1});
  for (int i = 0; i < 4; ++i) p->OnAccess({0, 1});
  p->OnInsert({0, 2});
  p->OnInsert({0, 3});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 2}));
  auto lru = MakeLruPolicy();
  lru->OnInsert({0, 1});
  for (int i = 0; i < 4; ++i) lru->OnAccess({0, 1});
  lru->OnInsert({0, 2});
  lru->OnInsert({0, 3});
  EXPECT_EQ(lru->Victim(kAny), (ExpertId{0, 1}));
}

TEST(Policy, LfuAgingForgetsOldPopularity) {
  auto p = MakeLfuAgingPolicy(/*aging_period=*/4);
  p->OnInsert({0, 1});
  p->OnAccess({0, 1});
  p->OnAccess({0, 1});  // count 3, clock 3
  p->OnInsert({0, 2});  // clock 4: aging halves all: {1: 1.5, 2: 0.5}
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 2}));
  p->OnAccess({0, 2});
  p->OnAccess({0, 2});  // {1: 1.5, 2: 2.5}
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 1}));
}

TEST(Policy, PinnedLayersAreNeverVictims) {
  auto p = MakePinnedLayersPolicy(MakeLruPolicy(), {0});
  p->OnInsert({0, 1});
  p->OnInsert({1, 1});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{1, 1}));
  p->OnErase({1, 1});
  EXPECT_EQ(p->Victim(kAny), std::nullopt);
  EXPECT_EQ(p->name(), "pinned_layers+lru");
}

// Every step chooses experts 0..2 of each of 4 layers: a pass touches 12 experts. A cache of 6 is
// under one pass, so LRU evicts exactly what the next pass needs and never hits; next_use keeps
// a stable half (its bypass refuses to churn) and hits it every pass, as MIN does.
TEST(Policy, NextUseKeepsAStableSetThroughTheCyclicScan) {
  RoutingTrace trace{4, 8, {}};
  for (int64_t step = 0; step < 200; ++step) {
    for (int32_t layer = 0; layer < 4; ++layer) trace.records.push_back({step, layer, {0, 1, 2}});
  }
  auto lru = MakeLruPolicy();
  EXPECT_EQ(SimulatePolicy(trace, 6, *lru).hits, 0u);
  auto next_use = MakeNextUsePolicy(4, 8, 0.01);
  const SimResult r = SimulatePolicy(trace, 6, *next_use);
  const SimResult min = SimulateBelady(TraceAccesses(trace), 6, /*bypass=*/true);
  EXPECT_GT(r.hit_rate(), 0.45);  // 6 of 12 hit each pass once warm
  EXPECT_LE(r.hits, min.hits);
  EXPECT_GT(r.bypasses, 0u);
}

TEST(Policy, NextUseEvictsTheUnlikelyAndBypassesOneOffs) {
  auto p = MakeNextUsePolicy(3, 8, 0.01);
  // Layer 0 chooses expert 1 at every visit (and expert 2 at the first), layer 1 expert 3,
  // layer 2 expert 4.
  for (int v = 0; v < 20; ++v) {
    p->BeginVisit(0, v == 0 ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{1});
    p->BeginVisit(1, std::vector<int32_t>{3});
    p->BeginVisit(2, std::vector<int32_t>{4});
  }
  p->OnInsert({0, 1});
  p->OnInsert({0, 2});
  p->OnInsert({1, 3});
  // Layer 2 was visited last. Expert 2 has not come back for 19 visits: latest expected use.
  EXPECT_EQ(p->Victim(kAny), (ExpertId{0, 2}));
  // Among the regulars, layer 1's comes back after layer 0's.
  EXPECT_EQ(p->Victim([](ExpertId id) { return id.expert != 2; }), (ExpertId{1, 3}));
  // A visit of layer 2 chooses a new expert 5: it cannot come back before a whole pass, later
  // than the regular of layer 1, so it is not cached in its place ...
  p->BeginVisit(2, std::vector<int32_t>{4, 5});
  EXPECT_FALSE(p->Admit({2, 5}, {1, 3}));
  // ... but in place of expert 2, which has not come back for 20 visits, it is.
  EXPECT_TRUE(p->Admit({2, 5}, {0, 2}));
  // The experts of the visit in progress are never offered (they are about to be used).
  p->OnInsert({2, 4});
  p->OnErase({0, 2});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{1, 3}));
  EXPECT_EQ(p->Victim([](ExpertId id) { return id.layer == 2; }), std::nullopt);
}

TEST(Policy, NextUseProtectsPredictedExperts) {
  auto p = MakeNextUsePolicy(3, 8, 0.01);
  // A predictor that is always right: experts it names for a layer's next visit are chosen.
  for (int v = 0; v < 20; ++v) {
    for (int32_t layer = 0; layer < 3; ++layer) {
      const int32_t e = (v + layer) % 8;
      p->OnPredict(layer, std::vector<int32_t>{e});
      p->BeginVisit(layer, std::vector<int32_t>{e});
    }
  }
  // Uniform routing: by frequency alone no expert is more likely than another. Layer 2's
  // expert 7 is predicted for its next visit, so layer 1's expert 6 goes first.
  p->OnPredict(2, std::vector<int32_t>{7});
  p->OnInsert({1, 6});
  p->OnInsert({2, 7});
  EXPECT_EQ(p->Victim(kAny), (ExpertId{1, 6}));
}

TEST(Policy, MakePolicyByName) {
  for (const std::string& name : PolicyNames()) {
    PolicyOptions o;
    o.name = name;
    o.num_layers = 4;
    o.num_experts = 8;
    auto p = MakePolicy(o);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  PolicyOptions bad;
  bad.name = "fifo";
  EXPECT_EQ(MakePolicy(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MakePolicy(bad).status().message().find("lru"), std::string::npos);
  PolicyOptions shapeless;  // next_use, the default, needs the model's shape
  EXPECT_EQ(MakePolicy(shapeless).status().code(), absl::StatusCode::kInvalidArgument);
  PolicyOptions pinned;
  pinned.num_layers = 6;
  pinned.num_experts = 8;
  pinned.pinned_layers = {0, 5};
  EXPECT_EQ((*MakePolicy(pinned))->name(), "pinned_layers+next_use");
}

}  // namespace
}  // namespace moe::store
