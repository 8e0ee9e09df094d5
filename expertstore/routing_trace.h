// Routing traces: which experts each layer routed to at each engine step, as recorded from the
// engine or made synthetically, for the policy simulator (moe-store-sim).
//
// File format (text, one record per line, '#' starts a comment line):
//   moe-routing-trace 2 <num_layers> <num_experts>      first line: magic, version, sizes
//   <step> <layer> <expert> <expert> ...                 one line per (step, layer): the union of
//                                                        experts the batch needed, in request order
//   p <step> <layer> <expert> ...                        the prefetch predictor's guess for that
//                                                        layer's next visit, made before it
// Steps are non-decreasing; a step lists each layer at most once. Version 1 (no predictions) is
// still read. Text because traces are small
// next to what they describe (48 layers x 8 experts x 10k steps ~ 15 MB) and greppable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "expertstore/policy.h"

namespace moe::store {

struct RoutingRecord {
  int64_t step = 0;
  int32_t layer = 0;
  std::vector<int32_t> experts;
  bool prediction = false;  // a guess for the layer's next visit, not a use
};

struct RoutingTrace {
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  std::vector<RoutingRecord> records;
};

// NotFound: no file. InvalidArgument: names the line that is not in the format above (bad
// magic/version, an expert or layer out of range, steps going backwards).
absl::StatusOr<RoutingTrace> ReadRoutingTrace(const std::string& path);
// Internal names the file on an I/O error.
absl::Status WriteRoutingTrace(const std::string& path, const RoutingTrace& trace);

// Appends records to a trace file as the engine runs (one line per Append, flushed on Flush and
// on destruction), so a long recording needs no memory and a crash loses at most the tail.
// Not thread-safe: one writer per engine loop.
class RoutingTraceWriter {
 public:
  // Creates (truncates) `path` and writes the header. Internal names the file on failure.
  static absl::StatusOr<std::unique_ptr<RoutingTraceWriter>> Create(const std::string& path,
                                                                    int32_t num_layers,
                                                                    int32_t num_experts);
  ~RoutingTraceWriter();
  void Append(int64_t step, int32_t layer, const std::vector<int32_t>& experts);
  void AppendPrediction(int64_t step, int32_t layer, const std::vector<int32_t>& experts);
  // Internal when a write failed since the last call.
  absl::Status Flush();

 private:
  RoutingTraceWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  std::string path_;
  std::FILE* file_;
};

// The accesses a trace makes, in order: record by record, experts in the order listed
// (predictions are not accesses).
std::vector<ExpertId> TraceAccesses(const RoutingTrace& trace);

struct SyntheticTraceOptions {
  int32_t num_layers = 48;
  int32_t num_experts = 128;
  int32_t top_k = 8;  // experts per (step, layer)
  int64_t steps = 1000;
  // Popularity: expert of rank r (per layer, in a random order per layer) is drawn with
  // probability proportional to 1 / (r + 1)^zipf_s. 0 is uniform. Default: 1.
  double zipf_s = 1.0;
  // Temporal locality: each pick reuses an expert of the same layer's previous step with this
  // probability (the seed measured ~0.27 on real Qwen traffic). Default: 0.3.
  double locality = 0.3;
  uint64_t seed = 1;
};

// InvalidArgument names a bad field (top_k > num_experts, locality outside [0, 1], ...).
absl::StatusOr<RoutingTrace> MakeSyntheticTrace(const SyntheticTraceOptions& options);

}  // namespace moe::store
