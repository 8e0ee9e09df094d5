// The names, help texts, labels and buckets of the worker's metrics.
#include "service/metrics/worker_metrics.h"

#include <algorithm>
#include <string>
#include <utility>

namespace moe::service::metrics {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

// Counters only go up: move one to a cumulative total read from elsewhere.
void AdvanceTo(prometheus::Counter& counter, double total) {
  double delta = total - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& r) {
  requests_ = &BuildCounter()
                   .Name("moe_requests_total")
                   .Help(
                       "Requests the engine finished, by outcome (stop, length, cancelled, "
                       "deadline_exceeded, error, or the status that refused them)")
                   .Register(r);
  prompt_tokens_ = Counter(r, "moe_prompt_tokens_total", "Prompt tokens of finished requests");
  cached_prompt_tokens_ =
      Counter(r, "moe_cached_prompt_tokens_total",
              "Prompt tokens whose KV came from a kept session instead of a prefill");
  generation_tokens_ = Counter(r, "moe_generation_tokens_total", "Tokens generated");
  steps_ = Counter(r, "moe_engine_steps_total", "Engine steps run");
  queue_ = Hist(r, "moe_request_queue_time_seconds",
                "Seconds from arrival at the worker to the first engine step", kRequestBuckets);
  ttft_ = Hist(r, "moe_time_to_first_token_seconds",
               "Seconds from arrival at the worker to the first generated token", kTtftBuckets);
  itl_ = Hist(r, "moe_inter_token_latency_seconds",
              "Seconds between consecutive generated tokens of one request", kItlBuckets);
  e2e_ = Hist(r, "moe_e2e_request_latency_seconds",
              "Seconds from arrival at the worker to the request's last token", kRequestBuckets);
  running_ = Gauge(r, "moe_num_requests_running", "Sequences in the engine's running batch");
  waiting_ = Gauge(r, "moe_num_requests_waiting", "Sequences queued in the engine");
  kv_used_ = Gauge(r, "moe_kv_cache_used_bytes", "KV cache bytes held by sequences and sessions");
  kv_budget_ = Gauge(r, "moe_kv_cache_budget_bytes", "KV cache budget in bytes");
  kv_per_token_ = Gauge(r, "moe_kv_cache_bytes_per_token", "KV cache bytes one token takes");
  sessions_ = Gauge(r, "moe_kv_cache_sessions", "Conversations whose KV is kept between turns");
  state_used_ = Gauge(r, "moe_state_used_bytes",
                      "Recurrent-state bytes held by sequences, sessions and snapshots (hybrid "
                      "models; 0 otherwise)");
  state_budget_ = Gauge(r, "moe_state_budget_bytes",
                        "Recurrent-state bytes carved out of the KV cache budget (hybrid models)");
  state_slots_ = Gauge(r, "moe_state_slots", "Recurrent-state slots (hybrid models)");
  state_slots_used_ = Gauge(r, "moe_state_slots_used",
                            "Recurrent-state slots held by running sequences and kept sessions");
  state_snapshots_ =
      Gauge(r, "moe_state_snapshots", "Recurrent-state snapshots kept for prefix reuse");
  state_snapshot_hits_ = Counter(r, "moe_state_snapshot_hits_total",
                                 "Sequences whose state started from a snapshot (prefix reuse)");
  serving_ = Gauge(r, "moe_worker_serving", "1 when the worker admits new requests, 0 draining");
  phase_seconds_ = &BuildCounter()
                        .Name("moe_engine_phase_seconds_total")
                        .Help(
                            "Seconds the forward pass spent per phase (attention, routing, "
                            "expert_wait, expert_compute, dense, logits, prefetch)")
                        .Register(r);
  model_info_ = &BuildGauge()
                     .Name("moe_model_info")
                     .Help("The model this worker serves (value 1)")
                     .Register(r);
  store_lookups_ = &BuildCounter()
                        .Name("moe_store_lookups_total")
                        .Help("Expert store lookups by tier (device, host) and result (hit, miss)")
                        .Register(r);
  store_bytes_in_ = &BuildCounter()
                         .Name("moe_store_bytes_in_total")
                         .Help("Expert bytes copied into a tier")
                         .Register(r);
  store_evictions_ = &BuildCounter()
                          .Name("moe_store_evictions_total")
                          .Help("Experts evicted from a tier")
                          .Register(r);
  store_bypasses_ = &BuildCounter()
                         .Name("moe_store_bypasses_total")
                         .Help("Misses the eviction policy chose not to cache in a tier")
                         .Register(r);
  store_prefetches_ = &BuildCounter()
                          .Name("moe_store_prefetches_total")
                          .Help(
                              "Next-layer expert prefetches by result: issued (loads started), "
                              "used (later acquired; accuracy = used / issued), dropped (no slot)")
                          .Register(r);
  store_slots_ = &BuildGauge().Name("moe_store_slots").Help("Expert slots of a tier").Register(r);
  store_slot_bytes_ =
      &BuildGauge().Name("moe_store_slot_bytes").Help("Bytes of one slot of a tier").Register(r);
  blob_reads_ = Counter(r, "moe_store_blob_reads_total", "Expert reads from the blob files");
  blob_bytes_ = Counter(r, "moe_store_blob_read_bytes_total", "Bytes read from the blob files");
  blob_errors_ = Counter(r, "moe_store_blob_errors_total",
                         "Blob reads that failed (missing, truncated, checksum, I/O)");
  host_reads_ = Counter(r, "moe_store_host_reads_total",
                        "Experts that decode steps read from the host tier (not in VRAM when "
                        "routed; each costs its bytes over PCIe)");
  // The store counts latency in power-of-two microsecond buckets; these are their bounds.
  prometheus::Histogram::BucketBoundaries load_bounds;
  for (int b = 0; b < 31; ++b) load_bounds.push_back(static_cast<double>(int64_t{1} << b) * 1e-6);
  load_latency_ = Hist(r, "moe_store_load_latency_seconds",
                       "Seconds a lookup waited for its expert to load", load_bounds);
  for (const char* outcome : {"stop", "length", "cancelled", "deadline_exceeded", "error"}) {
    requests_->Add({{"outcome", outcome}});
  }
  for (const char* phase : {"attention", "routing", "expert_wait", "expert_compute", "dense",
                            "logits", "sampling", "prefetch"}) {
    phase_seconds_->Add({{"phase", phase}});
  }
  UpdateExpertStore(StoreCounters{});
}

void WorkerMetrics::RequestFinished(absl::string_view outcome, int64_t prompt_tokens,
                                    int64_t cached_prompt_tokens, int64_t completion_tokens) {
  requests_->Add({{"outcome", std::string(outcome)}}).Increment();
  prompt_tokens_->Increment(static_cast<double>(prompt_tokens));
  cached_prompt_tokens_->Increment(static_cast<double>(cached_prompt_tokens));
  generation_tokens_->Increment(static_cast<double>(completion_tokens));
}

void WorkerMetrics::SetEngine(const EngineGauges& g) {
  running_->Set(static_cast<double>(g.running));
  waiting_->Set(static_cast<double>(g.waiting));
  kv_used_->Set(static_cast<double>(g.kv_bytes_used));
  kv_budget_->Set(static_cast<double>(g.kv_bytes_budget));
  kv_per_token_->Set(static_cast<double>(g.kv_bytes_per_token));
  sessions_->Set(static_cast<double>(g.sessions));
  state_used_->Set(static_cast<double>(g.state_bytes_used));
  state_budget_->Set(static_cast<double>(g.state_bytes_budget));
  state_slots_->Set(static_cast<double>(g.state_slots));
  state_slots_used_->Set(static_cast<double>(g.state_slots_used));
  state_snapshots_->Set(static_cast<double>(g.state_snapshots));
  AdvanceTo(*state_snapshot_hits_, static_cast<double>(g.state_snapshot_hits));
}

void WorkerMetrics::SetPhaseTimes(const engine::PhaseTimes& t, int64_t steps) {
  const std::pair<const char*, int64_t> phases[] = {{"attention", t.attention_us},
                                                    {"routing", t.routing_us},
                                                    {"expert_wait", t.expert_wait_us},
                                                    {"expert_compute", t.expert_compute_us},
                                                    {"dense", t.dense_us},
                                                    {"logits", t.logits_us},
                                                    {"sampling", t.sampling_us},
                                                    {"prefetch", t.prefetch_us}};
  for (const auto& [phase, us] : phases) {
    AdvanceTo(phase_seconds_->Add({{"phase", phase}}), static_cast<double>(us) * 1e-6);
  }
  AdvanceTo(*steps_, static_cast<double>(steps));
}

void WorkerMetrics::SetModelInfo(absl::string_view model, absl::string_view architecture) {
  model_info_->Add({{"model", std::string(model)}, {"architecture", std::string(architecture)}})
      .Set(1);
}

StoreCounters FromStoreStats(const store::StoreStats& s) {
  StoreCounters c;
  auto tier = [](const store::TierStats& t) {
    return StoreTierCounters{t.slots, t.slot_bytes, t.hits, t.misses, t.bytes_in, t.evictions,
                             t.bypasses};
  };
  c.device = tier(s.device);
  c.host = tier(s.host);
  c.blob_reads = s.blob_reads;
  c.blob_bytes_read = s.blob_bytes_read;
  c.blob_errors = s.blob_errors;
  c.prefetch_issued = s.prefetch_issued;
  c.prefetch_used = s.prefetch_used;
  c.prefetch_dropped = s.prefetch_dropped;
  c.host_reads = s.host_reads;
  c.load_latency_us_buckets.assign(s.load_latency_us.counts.begin(),
                                   s.load_latency_us.counts.end());
  c.load_total_us = s.load_latency_us.total_us;
  return c;
}

void WorkerMetrics::UpdateExpertStore(const StoreCounters& store) {
  const std::pair<const char*, const StoreTierCounters*> tiers[] = {{"device", &store.device},
                                                                    {"host", &store.host}};
  for (const auto& [tier, t] : tiers) {
    AdvanceTo(store_lookups_->Add({{"tier", tier}, {"result", "hit"}}),
              static_cast<double>(t->hits));
    AdvanceTo(store_lookups_->Add({{"tier", tier}, {"result", "miss"}}),
              static_cast<double>(t->misses));
    AdvanceTo(store_bytes_in_->Add({{"tier", tier}}), static_cast<double>(t->bytes_in));
    AdvanceTo(store_evictions_->Add({{"tier", tier}}), static_cast<double>(t->evictions));
    AdvanceTo(store_bypasses_->Add({{"tier", tier}}), static_cast<double>(t->bypasses));
    store_slots_->Add({{"tier", tier}}).Set(static_cast<double>(t->slots));
    store_slot_bytes_->Add({{"tier", tier}}).Set(static_cast<double>(t->slot_bytes));
  }
  AdvanceTo(*blob_reads_, static_cast<double>(store.blob_reads));
  AdvanceTo(*blob_bytes_, static_cast<double>(store.blob_bytes_read));
  AdvanceTo(*blob_errors_, static_cast<double>(store.blob_errors));
  AdvanceTo(*host_reads_, static_cast<double>(store.host_reads));
  const std::pair<const char*, uint64_t> prefetches[] = {{"issued", store.prefetch_issued},
                                                         {"used", store.prefetch_used},
                                                         {"dropped", store.prefetch_dropped}};
  for (const auto& [result, n] : prefetches) {
    AdvanceTo(store_prefetches_->Add({{"result", result}}), static_cast<double>(n));
  }
  // Feed the histogram the loads counted since the last call, bucket by bucket (the store's
  // bucket b is our bucket b; its open last bucket is our +Inf).
  const size_t n = store.load_latency_us_buckets.size();
  if (n == 0) return;
  load_buckets_seen_.resize(std::max(load_buckets_seen_.size(), n), 0);
  std::vector<double> increments(32, 0.0);
  bool any = false;
  for (size_t b = 0; b < n; ++b) {
    const uint64_t delta = store.load_latency_us_buckets[b] - load_buckets_seen_[b];
    increments[std::min<size_t>(b, 31)] += static_cast<double>(delta);
    any = any || delta > 0;
    load_buckets_seen_[b] = store.load_latency_us_buckets[b];
  }
  if (!any) return;
  load_latency_->ObserveMultiple(increments,
                                 static_cast<double>(store.load_total_us - load_us_seen_) * 1e-6);
  load_us_seen_ = store.load_total_us;
}

}  // namespace moe::service::metrics
