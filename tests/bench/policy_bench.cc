// policy-bench: the CPU cost of each eviction policy's bookkeeping per expert access (Google
// Benchmark), replaying the simulator's default synthetic trace (48 layers x 128 experts, top-8,
// Zipf 1, locality 0.3) at cache sizes of 5, 10 and 25% of the experts. The figure includes the
// simulated cache's own hash set, so it bounds the policy's share from above. Goal: < 1 us.
#include <string>

#include "benchmark/benchmark.h"
#include "expertstore/belady.h"
#include "expertstore/routing_trace.h"

namespace moe::store {
namespace {

const RoutingTrace& Trace() {
  static const RoutingTrace trace = *MakeSyntheticTrace(SyntheticTraceOptions{});
  return trace;
}

void BM_Policy(benchmark::State& state, const std::string& name) {
  const RoutingTrace& trace = Trace();
  PolicyOptions o;
  o.name = name;
  o.num_layers = trace.num_layers;
  o.num_experts = trace.num_experts;
  const int64_t capacity = int64_t{trace.num_layers} * trace.num_experts * state.range(0) / 100;
  uint64_t accesses = 0;
  double hit_rate = 0;
  for (auto _ : state) {
    auto policy = MakePolicy(o);
    const SimResult r = SimulatePolicy(trace, capacity, **policy);
    accesses += r.accesses;
    hit_rate = r.hit_rate();
  }
  // Seconds per access, printed with an SI prefix (n, u).
  state.counters["per_access"] = benchmark::Counter(
      static_cast<double>(accesses), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["hit_rate"] = hit_rate;
}

BENCHMARK_CAPTURE(BM_Policy, next_use, std::string("next_use"))
    ->Arg(5)->Arg(10)->Arg(25)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Policy, lru, std::string("lru"))
    ->Arg(5)->Arg(10)->Arg(25)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Policy, weighted_lru, std::string("weighted_lru"))
    ->Arg(5)->Arg(10)->Arg(25)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Policy, lfu_aging, std::string("lfu_aging"))
    ->Arg(5)->Arg(10)->Arg(25)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace moe::store

BENCHMARK_MAIN();
