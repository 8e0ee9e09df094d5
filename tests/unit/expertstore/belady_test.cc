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
  auto lru = MakeLruPolicy();
  EXPECT_EQ(SimulatePolicy(seq, 3, *lru).hits, 2u);
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
    const double best = SimulateBelady(accesses, capacity).hit_rate();
    for (const std::string& name : PolicyNames()) {
      PolicyOptions po;
      po.name = name;
      auto policy = MakePolicy(po);
      ASSERT_TRUE(policy.ok());
      EXPECT_LE(SimulatePolicy(accesses, capacity, **policy).hit_rate(), best + 1e-12)
          << name << " at " << capacity;
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
    for (const RoutingRecord& r : trace->records) (*writer)->Append(r.step, r.layer, r.experts);
    ASSERT_TRUE((*writer)->Flush().ok());
  }
  auto streamed = ReadRoutingTrace(path + ".2");
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(TraceAccesses(*streamed), TraceAccesses(*trace));
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
