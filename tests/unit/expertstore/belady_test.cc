// belady.h and routing_trace.h: MIN on a hand-checked sequence, MIN >= every policy on synthetic
// traces, trace files round-trip and bad lines are named.
#include "expertstore/belady.h"

#include <fstream>

#include "expertstore/routing_trace.h"
#include "gtest/gtest.h"
#include "tests/unit/expertstore/store_test_util.h"

namespace moe::store {
namespace {

std::vector<ExpertId> Seq(std::initializer_list<int32_t> experts) {
  std::vector<ExpertId> out;
  for (int32_t e : experts) out.push_back({0, e});
  return out;
}

TEST(Belady, TextbookSequence) {
  // Capacity 3 on 1 2 3 4 1 2 5 1 2 3 4 5: MIN has 7 misses (5 hits), LRU 10 misses (2 hits).
  const auto seq = Seq({1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5});
  EXPECT_EQ(SimulateBelady(seq, 3).hits, 5u);
  // With bypass, 4 and 5 are not cached (each is next used after every resident): 5 hits too.
  EXPECT_EQ(SimulateBelady(seq, 3, /*bypass=*/true).hits, 5u);
  RoutingTrace trace{1, 8, {}};
  for (size_t i = 0; i < seq.size(); ++i) {
    trace.records.push_back({static_cast<int64_t>(i), 0, {seq[i].expert}});
  }
  auto lru = MakeLruPolicy();
  EXPECT_EQ(SimulatePolicy(trace, 3, *lru).hits, 2u);
  EXPECT_EQ(SimulateBelady(seq, 0).hits, 0u);
  EXPECT_EQ(SimulateBelady(seq, 5).hits, 7u);  // only compulsory misses
}

TEST(Belady, IsAnUpperBoundForEveryPolicy) {
  SyntheticTraceOptions o;
  o.num_layers = 4;
  o.num_experts = 32;
  o.top_k = 4;
  o.steps = 300;
  auto trace = MakeSyntheticTrace(o);
  ASSERT_TRUE(trace.ok());
  const auto accesses = TraceAccesses(*trace);
  ASSERT_EQ(accesses.size(), 4u * 4u * 300u);
  for (int64_t capacity : {4, 16, 64}) {
    // A cache that may bypass (next_use) is bounded by MIN with bypass, the others by MIN.
    const SimResult min = SimulateBelady(accesses, capacity);
    const SimResult min_bypass = SimulateBelady(accesses, capacity, /*bypass=*/true);
    EXPECT_GE(min_bypass.hits, min.hits);
    for (const std::string& name : PolicyNames()) {
      PolicyOptions po;
      po.name = name;
      po.num_layers = o.num_layers;
      po.num_experts = o.num_experts;
      auto policy = MakePolicy(po);
      ASSERT_TRUE(policy.ok());
      const SimResult r = SimulatePolicy(*trace, capacity, **policy);
      EXPECT_EQ(r.accesses, accesses.size());
      EXPECT_LE(r.hits, r.bypasses > 0 ? min_bypass.hits : min.hits) << name << " at " << capacity;
    }
  }
}

TEST(RoutingTraceTest, RoundTripAndErrors) {
  testing::TempDir dir;
  SyntheticTraceOptions o;
  o.num_layers = 3;
  o.num_experts = 10;
  o.top_k = 2;
  o.steps = 5;
  auto trace = MakeSyntheticTrace(o);
  ASSERT_TRUE(trace.ok());
  const std::string path = dir.path() + "/t.trace";
  ASSERT_TRUE(WriteRoutingTrace(path, *trace).ok());
  auto back = ReadRoutingTrace(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(TraceAccesses(*back), TraceAccesses(*trace));
  {
    auto writer = RoutingTraceWriter::Create(path + ".2", o.num_layers, o.num_experts);
    ASSERT_TRUE(writer.ok());
    for (const RoutingRecord& r : trace->records) {
      (*writer)->AppendPrediction(r.step, r.layer, {7});  // predictions are kept, not accesses
      (*writer)->Append(r.step, r.layer, r.experts);
    }
    ASSERT_TRUE((*writer)->Flush().ok());
  }
  auto streamed = ReadRoutingTrace(path + ".2");
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(TraceAccesses(*streamed), TraceAccesses(*trace));
  ASSERT_EQ(streamed->records.size(), 2 * trace->records.size());
  EXPECT_TRUE(streamed->records[0].prediction);
  EXPECT_EQ(streamed->records[0].experts, std::vector<int32_t>{7});
  EXPECT_FALSE(streamed->records[1].prediction);
  {
    std::ofstream bad(path);
    bad << "moe-routing-trace 1 3 10\n0 0 1 2\n0 1 11\n";
  }
  auto err = ReadRoutingTrace(path);
  EXPECT_EQ(err.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(err.status().message().find(":3: expert 11"), std::string::npos) << err.status();
  o.top_k = 11;
  EXPECT_EQ(MakeSyntheticTrace(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moe::store
