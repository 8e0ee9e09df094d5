// policy.h: each policy's victim order on small hand-made sequences, the evictable filter, the
// pinned-layers decorator and the name table.
#include "expertstore/policy.h"

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

TEST(Policy, MakePolicyByName) {
  for (const std::string& name : PolicyNames()) {
    PolicyOptions o;
    o.name = name;
    auto p = MakePolicy(o);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  PolicyOptions bad;
  bad.name = "fifo";
  EXPECT_EQ(MakePolicy(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MakePolicy(bad).status().message().find("lru"), std::string::npos);
  PolicyOptions pinned;
  pinned.pinned_layers = {0, 5};
  EXPECT_EQ((*MakePolicy(pinned))->name(), "pinned_layers+lru");
}

}  // namespace
}  // namespace moe::store
