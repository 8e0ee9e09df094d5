// moe-store-sim: replays an expert-routing trace (a file, or a synthetic Zipf trace) through each
// eviction policy at several cache sizes and prints the hit rate next to Belady's optimum (MIN),
// or (--grid) every policy as a fraction of MIN over a grid of synthetic traces.
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
ABSL_FLAG(std::string, policies, "next_use,lru,weighted_lru,lfu_aging",
          "Eviction policies to compare, comma-separated");
ABSL_FLAG(double, frequency_weight, 1.0, "weighted_lru: W in access_count * W + last_used");
ABSL_FLAG(int64_t, aging_period, 4096, "lfu_aging: accesses between halvings of all counts");
ABSL_FLAG(double, frequency_alpha, 0.01,
          "next_use: each visit of a layer weighs its experts' selection statistics by "
          "1 - frequency_alpha");
ABSL_FLAG(bool, grid, false,
          "Replay the synthetic grid instead of one trace: shapes 48 x top-8 of 128, 48 x top-8 "
          "of 256, 60 x top-10 of 512; --zipf_s 0, 0.5, 1, 1.2; --locality 0.1, 0.3, 0.6 "
          "(--steps and --seed apply); prints each policy's hit rate as a % of MIN's");
ABSL_FLAG(std::string, pinned_layers, "",
          "Comma-separated layers whose experts are never evicted (wraps every policy)");

namespace {

using namespace moe::store;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "moe-store-sim: %s\n", std::string(s.ToString()).c_str());
  return 1;
}

struct Comparison {
  std::vector<std::string> policies;
  PolicyOptions base;            // each policy's options but the name and the shape
  std::vector<double> percents;  // cache sizes, % of layers x experts
};

absl::StatusOr<Comparison> ComparisonFromFlags() {
  Comparison c;
  c.base.frequency_weight = absl::GetFlag(FLAGS_frequency_weight);
  c.base.aging_period = absl::GetFlag(FLAGS_aging_period);
  c.base.frequency_alpha = absl::GetFlag(FLAGS_frequency_alpha);
  for (absl::string_view l :
       absl::StrSplit(absl::GetFlag(FLAGS_pinned_layers), ',', absl::SkipEmpty())) {
    int32_t layer;
    if (!absl::SimpleAtoi(l, &layer)) {
      return absl::InvalidArgumentError(absl::StrCat("--pinned_layers: '", l, "'"));
    }
    c.base.pinned_layers.push_back(layer);
  }
  c.policies = absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty());
  for (const std::string& name : c.policies) {  // fail on a bad name before any simulation
    PolicyOptions o = c.base;
    o.name = name;
    o.num_layers = o.num_experts = 1;
    if (auto p = MakePolicy(o); !p.ok()) return p.status();
  }
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_budgets), ',', absl::SkipEmpty())) {
    double percent;
    if (!absl::SimpleAtod(b, &percent) || percent < 0 || percent > 100) {
      return absl::InvalidArgumentError(absl::StrCat("--budgets: '", b, "' is not 0..100"));
    }
    c.percents.push_back(percent);
  }
  return c;
}

struct Row {
  int64_t capacity = 0;
  std::vector<double> hit_rates;  // per policy
  double min = 0, min_bypass = 0;
};

std::vector<Row> Simulate(const RoutingTrace& trace, const Comparison& c) {
  const int64_t total = int64_t{trace.num_layers} * trace.num_experts;
  const std::vector<ExpertId> accesses = TraceAccesses(trace);
  std::vector<Row> rows;
  for (const double percent : c.percents) {
    Row row;
    row.capacity = static_cast<int64_t>(percent / 100.0 * static_cast<double>(total));
    for (const std::string& name : c.policies) {
      PolicyOptions o = c.base;
      o.name = name;
      o.num_layers = trace.num_layers;
      o.num_experts = trace.num_experts;
      auto policy = MakePolicy(o);  // checked by ComparisonFromFlags
      row.hit_rates.push_back(SimulatePolicy(trace, row.capacity, **policy).hit_rate());
    }
    row.min = SimulateBelady(accesses, row.capacity).hit_rate();
    row.min_bypass = SimulateBelady(accesses, row.capacity, /*bypass=*/true).hit_rate();
    rows.push_back(std::move(row));
  }
  return rows;
}

// One trace: each policy's hit rate (and as a % of MIN's), MIN, and MIN when misses may bypass
// the cache (the optimum for next_use, which bypasses).
void PrintTable(const RoutingTrace& trace, const Comparison& c) {
  const int64_t total = int64_t{trace.num_layers} * trace.num_experts;
  std::printf("%-18s", "cache (experts)");
  for (const std::string& name : c.policies) {
    std::printf(" %16s", (c.base.pinned_layers.empty() ? name : "pinned+" + name).c_str());
  }
  std::printf(" %12s %12s\n", "belady (MIN)", "MIN+bypass");
  for (const Row& row : Simulate(trace, c)) {
    std::printf("%-18s", absl::StrFormat("%d (%.1f%%)", row.capacity,
                                         100.0 * static_cast<double>(row.capacity) / total)
                             .c_str());
    for (const double h : row.hit_rates) {
      std::printf("  %6.2f%% (%3.0f%%)", 100.0 * h, row.min > 0 ? 100.0 * h / row.min : 100.0);
    }
    std::printf(" %11.2f%% %11.2f%%\n", 100.0 * row.min, 100.0 * row.min_bypass);
  }
}

// The grid: a line per (shape, zipf, locality, budget), each policy as a % of MIN's hit rate.
int RunGrid(const Comparison& c) {
  struct Shape {
    int32_t layers, experts, top_k;
  };
  std::printf("%-22s %5s %5s %6s %7s", "shape", "zipf", "loc", "budget", "MIN");
  for (const std::string& name : c.policies) std::printf(" %13s", name.c_str());
  std::printf("   (policy hit rate, and as %% of MIN)\n");
  for (const Shape shape : {Shape{48, 128, 8}, Shape{48, 256, 8}, Shape{60, 512, 10}}) {
    for (const double zipf : {0.0, 0.5, 1.0, 1.2}) {
      for (const double locality : {0.1, 0.3, 0.6}) {
        SyntheticTraceOptions o;
        o.num_layers = shape.layers;
        o.num_experts = shape.experts;
        o.top_k = shape.top_k;
        o.steps = absl::GetFlag(FLAGS_steps);
        o.seed = absl::GetFlag(FLAGS_seed);
        o.zipf_s = zipf;
        o.locality = locality;
        auto trace = MakeSyntheticTrace(o);
        if (!trace.ok()) return Fail(trace.status());
        const std::vector<Row> rows = Simulate(*trace, c);
        for (size_t b = 0; b < rows.size(); ++b) {
          std::printf("%-22s %5.1f %5.1f %5.0f%% %6.2f%%",
                      absl::StrFormat("%d x top-%d of %d", shape.layers, shape.top_k,
                                      shape.experts).c_str(),
                      zipf, locality, c.percents[b], 100.0 * rows[b].min);
          for (const double h : rows[b].hit_rates) {
            std::printf(" %5.1f%% (%3.0f%%)", 100.0 * h,
                        rows[b].min > 0 ? 100.0 * h / rows[b].min : 100.0);
          }
          std::printf("\n");
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  moe::base::ParseFlags(argc, argv,
      "Replays an expert-routing trace through each eviction policy at several cache sizes and "
      "prints hit rates next to Belady's optimum (MIN).\nUsage: moe-store-sim [--trace=FILE] "
      "[--budgets=5,10,25] [--policies=next_use,lru,weighted_lru,lfu_aging] [--grid]",
      __FILE__);
  absl::StatusOr<Comparison> comparison = ComparisonFromFlags();
  if (!comparison.ok()) return Fail(comparison.status());
  if (absl::GetFlag(FLAGS_grid)) return RunGrid(*comparison);

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
  size_t predictions = 0;
  for (const RoutingRecord& r : trace.records) predictions += r.prediction;
  std::printf("trace: %s\n%d layers x %d experts = %ld experts, %zu accesses, %zu predictions\n",
              source.c_str(), trace.num_layers, trace.num_experts,
              static_cast<long>(int64_t{trace.num_layers} * trace.num_experts),
              TraceAccesses(trace).size(), predictions);
  PrintTable(trace, *comparison);
  return 0;
}
