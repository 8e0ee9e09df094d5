// The worker's metrics: the engine's view (what vLLM exports per engine) and the expert store's
// counters. Names, help, labels and buckets live in worker_metrics.cc only.
// All methods are thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "engine/model.h"
#include "expertstore/stats.h"
#include "service/metrics/common.h"

namespace moe::service::metrics {

// Engine counts after a step (from Engine::Stats()).
struct EngineGauges {
  int64_t running = 0, waiting = 0;
  int64_t kv_bytes_used = 0, kv_bytes_budget = 0, kv_bytes_per_token = 0;
  int64_t sessions = 0;
  // Hybrid models' recurrent-state slots (0 for other models; engine.h has the budget rule).
  int64_t state_bytes_used = 0, state_bytes_budget = 0;
  int64_t state_slots = 0, state_slots_used = 0;
  int64_t state_snapshots = 0, state_snapshot_hits = 0;  // hits: cumulative
};

// The expert store's cumulative counters (expertstore/stats.h's StoreStats, copied by
// FromStoreStats so the registry's users need not know the store).
struct StoreTierCounters {
  int64_t slots = 0;
  uint64_t slot_bytes = 0;
  uint64_t hits = 0, misses = 0;
  uint64_t bytes_in = 0;  // bytes copied into this tier
  uint64_t evictions = 0;
  uint64_t bypasses = 0;
};
struct StoreCounters {
  StoreTierCounters device, host;
  uint64_t blob_reads = 0, blob_bytes_read = 0, blob_errors = 0;
  // Next-layer prefetch (engine --prefetch): loads started, later acquired, found no slot.
  uint64_t prefetch_issued = 0, prefetch_used = 0, prefetch_dropped = 0;
  uint64_t host_reads = 0;
  // Load latency: bucket b counts loads that took [2^(b-1), 2^b) microseconds (b = 0: < 1 us).
  std::vector<uint64_t> load_latency_us_buckets;
  uint64_t load_total_us = 0;
};

// Copies the store's own stats struct into ours.
StoreCounters FromStoreStats(const store::StoreStats& stats);

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  // `outcome`: a finish reason (stop, length, cancelled, error), deadline_exceeded (cancelled
  // because the call's deadline passed) or a status label.
  void RequestFinished(absl::string_view outcome, int64_t prompt_tokens,
                       int64_t cached_prompt_tokens, int64_t completion_tokens);
  void ObserveQueue(double seconds) { queue_->Observe(seconds); }
  void ObserveTtft(double seconds) { ttft_->Observe(seconds); }
  void ObserveItl(double seconds) { itl_->Observe(seconds); }
  void ObserveE2e(double seconds) { e2e_->Observe(seconds); }
  void SetEngine(const EngineGauges& gauges);
  // Lifetime totals from Model::phase_times(); exported as counters of seconds.
  void SetPhaseTimes(const engine::PhaseTimes& times, int64_t steps);
  void SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }
  void SetModelInfo(absl::string_view model, absl::string_view architecture);
  // Where the expert store's counters plug in: call after each step with its cumulative
  // counters. Until the tiered store lands, the model reads experts straight from the checkpoint
  // and nothing calls this, so the moe_store_* series stay at 0.
  void UpdateExpertStore(const StoreCounters& store);

 private:
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Counter *prompt_tokens_, *cached_prompt_tokens_, *generation_tokens_, *steps_;
  prometheus::Histogram *queue_, *ttft_, *itl_, *e2e_;
  prometheus::Gauge *running_, *waiting_, *kv_used_, *kv_budget_, *kv_per_token_, *sessions_,
      *serving_;
  prometheus::Gauge *state_used_, *state_budget_, *state_slots_, *state_slots_used_,
      *state_snapshots_;
  prometheus::Counter* state_snapshot_hits_;
  prometheus::Family<prometheus::Counter>* phase_seconds_;
  prometheus::Family<prometheus::Gauge>* model_info_;
  prometheus::Family<prometheus::Counter>* store_lookups_;
  prometheus::Family<prometheus::Counter>* store_bytes_in_;
  prometheus::Family<prometheus::Counter>* store_evictions_;
  prometheus::Family<prometheus::Counter>* store_bypasses_;
  prometheus::Family<prometheus::Counter>* store_prefetches_;
  prometheus::Family<prometheus::Gauge>* store_slots_;
  prometheus::Family<prometheus::Gauge>* store_slot_bytes_;
  prometheus::Counter *blob_reads_, *blob_bytes_, *blob_errors_, *host_reads_;
  prometheus::Histogram* load_latency_;
  std::vector<uint64_t> load_buckets_seen_;  // cumulative bucket counts already observed
  uint64_t load_us_seen_ = 0;
};

}  // namespace moe::service::metrics
