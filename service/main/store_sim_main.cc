// moe-store-sim: replays an expert-routing trace (a file, or a synthetic Zipf trace) through each
// eviction policy at several cache sizes and prints the hit rate next to Belady's optimum (MIN).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "expertstore/belady.h"
#include "expertstore/policy.h"
#include "expertstore/routing_trace.h"
#include "kernels/base/flags.h"

ABSL_FLAG(std::string, trace, "",
          "Routing trace file (format in expertstore/routing_trace.h); empty: a synthetic trace "
          "from the --layers/--experts/--top_k/--steps/--zipf_s/--locality/--seed flags");
ABSL_FLAG(std::string, write_trace, "", "Also write the trace used to this file");
ABSL_FLAG(int32_t, layers, 48, "Synthetic trace: MoE layers");
ABSL_FLAG(int32_t, experts, 128, "Synthetic trace: experts per layer");
ABSL_FLAG(int32_t, top_k, 8, "Synthetic trace: experts per (step, layer)");
ABSL_FLAG(int64_t, steps, 1000, "Synthetic trace: engine steps");
ABSL_FLAG(double, zipf_s, 1.0, "Synthetic trace: Zipf exponent of expert popularity (0: uniform)");
ABSL_FLAG(double, locality, 0.3,
          "Synthetic trace: probability that a pick reuses an expert of the layer's previous step");
ABSL_FLAG(uint64_t, seed, 1, "Synthetic trace: random seed");
ABSL_FLAG(std::string, budgets, "5,10,25,50",
          "Cache sizes to simulate, as percentages of all experts (layers x experts), "
          "comma-separated");
ABSL_FLAG(std::string, policies, "lru,weighted_lru,lfu_aging",
          "Eviction policies to compare, comma-separated");
ABSL_FLAG(double, frequency_weight, 1.0, "weighted_lru: W in access_count * W + last_used");
ABSL_FLAG(int64_t, aging_period, 4096, "lfu_aging: accesses between halvings of all counts");
ABSL_FLAG(std::string, pinned_layers, "",
          "Comma-separated layers whose experts are never evicted (wraps every policy)");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "moe-store-sim: %s\n", std::string(s.ToString()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Replays an expert-routing trace through each eviction policy at several cache sizes and "
      "prints hit rates next to Belady's optimum (MIN).\nUsage: moe-store-sim [--trace=FILE] "
      "[--budgets=5,10,25] [--policies=lru,weighted_lru,lfu_aging]",
      __FILE__);
  using namespace moe::store;

  RoutingTrace trace;
  std::string source;
  if (const std::string path = absl::GetFlag(FLAGS_trace); !path.empty()) {
    auto t = ReadRoutingTrace(path);
    if (!t.ok()) return Fail(t.status());
    trace = std::move(*t);
    source = path;
  } else {
    SyntheticTraceOptions o;
    o.num_layers = absl::GetFlag(FLAGS_layers);
    o.num_experts = absl::GetFlag(FLAGS_experts);
    o.top_k = absl::GetFlag(FLAGS_top_k);
    o.steps = absl::GetFlag(FLAGS_steps);
    o.zipf_s = absl::GetFlag(FLAGS_zipf_s);
    o.locality = absl::GetFlag(FLAGS_locality);
    o.seed = absl::GetFlag(FLAGS_seed);
    auto t = MakeSyntheticTrace(o);
    if (!t.ok()) return Fail(t.status());
    trace = std::move(*t);
    source = absl::StrFormat("synthetic zipf_s=%.2f locality=%.2f top_k=%d steps=%d seed=%d",
                             o.zipf_s, o.locality, o.top_k, o.steps, o.seed);
  }
  if (const std::string out = absl::GetFlag(FLAGS_write_trace); !out.empty()) {
    if (absl::Status s = WriteRoutingTrace(out, trace); !s.ok()) return Fail(s);
  }

  PolicyOptions base;
  base.frequency_weight = absl::GetFlag(FLAGS_frequency_weight);
  base.aging_period = absl::GetFlag(FLAGS_aging_period);
  for (absl::string_view l :
       absl::StrSplit(absl::GetFlag(FLAGS_pinned_layers), ',', absl::SkipEmpty())) {
    int32_t layer;
    if (!absl::SimpleAtoi(l, &layer)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--pinned_layers: '", l, "'")));
    }
    base.pinned_layers.push_back(layer);
  }
  std::vector<std::string> policies =
      absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty());
  for (const std::string& name : policies) {  // fail on a bad name before any simulation
    PolicyOptions o = base;
    o.name = name;
    if (auto p = MakePolicy(o); !p.ok()) return Fail(p.status());
  }
  const int64_t total = int64_t{trace.num_layers} * trace.num_experts;
  std::vector<int64_t> capacities;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_budgets), ',', absl::SkipEmpty())) {
    double percent;
    if (!absl::SimpleAtod(b, &percent) || percent < 0 || percent > 100) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--budgets: '", b, "' is not 0..100")));
    }
    capacities.push_back(static_cast<int64_t>(percent / 100.0 * static_cast<double>(total)));
  }

  const std::vector<ExpertId> accesses = TraceAccesses(trace);
  std::printf("trace: %s\n%d layers x %d experts = %ld experts, %zu accesses\n", source.c_str(),
              trace.num_layers, trace.num_experts, static_cast<long>(total), accesses.size());
  std::printf("%-18s", "cache (experts)");
  for (const std::string& name : policies) {
    std::printf(" %14s", (base.pinned_layers.empty() ? name : "pinned+" + name).c_str());
  }
  std::printf(" %14s\n", "belady (MIN)");
  for (const int64_t capacity : capacities) {
    std::printf("%-18s", absl::StrFormat("%d (%.1f%%)", capacity,
                                         100.0 * static_cast<double>(capacity) / total)
                             .c_str());
    for (const std::string& name : policies) {
      PolicyOptions o = base;
      o.name = name;
      auto policy = MakePolicy(o);
      std::printf(" %13.2f%%", 100.0 * SimulatePolicy(accesses, capacity, **policy).hit_rate());
    }
    std::printf(" %13.2f%%\n", 100.0 * SimulateBelady(accesses, capacity).hit_rate());
  }
  return 0;
}
