// MoeLayer: the sparse MoE layers of a model, for any batch: the router, the top-k choice, the
// routed experts' SwiGLU MLPs and (qwen2_moe) the shared expert. The one place that knows how
// the experts are reached; Model::Forward calls Run per sparse layer and nothing else.
//
// Legend: T tokens in the step, H hidden, E experts, K experts per token.
//
// Each layer's path is chosen once per step by ChoosePath, from three facts:
//   kResident   every expert of the layer resident in backend memory in one format (the
//               checkpoint provider, moe-bench's provider): the routing never leaves the device
//               (Backend::ExpertFfnRouted reads Route's output through a device table of the
//               layer's expert pointers; CUDA plans the per-expert groups on the GPU).
//   kReadable   the tiered store holds every expert of the layer in VRAM or in the host tier the
//               backend reads in place (ExpertStore::PinReadable): routed on the device the same
//               way, through a table of where each expert is; the step's routed ids are copied to
//               the host once, after the last layer, and reported to the store then (Use: the
//               policy's recency, host-tier reads, the misses loaded for the next steps).
//   kHostRouted anything else (some expert only on disk, a routing trace being recorded): the
//               routing is copied to the host; with a store, the experts resident in VRAM at that
//               moment run first behind that copy; the host acquires every expert the step uses
//               (stats and eviction see them all) and runs the others as their loads complete.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "expertstore/expert_provider.h"
#include "expertstore/expert_store.h"
#include "expertstore/routing_trace.h"
#include "kernels/backend.h"

namespace moe::engine {

// Time spent per phase over the model's lifetime, in microseconds (the --timings breakdown).
// attention: norms, projections, q/k norm, RoPE, KV write, attention, residual add; routing:
// router, top-k, the host copy of the choice, grouping; expert compute: the expert launches and
// the residual add (fused with the next layer's input norm); logits: final norm, lm head (and
// Forward's copy of the logits to the host); sampling: ForwardSample's Backend::Sample, which
// waits for the device. On a backend that queues work (CUDA) these are host times unless
// exact timings are on: then the phase that synchronizes (routing) absorbs the device time of
// the phases before it.
struct PhaseTimes {
  int64_t attention_us = 0, routing_us = 0, expert_wait_us = 0, expert_compute_us = 0,
          dense_us = 0, logits_us = 0, sampling_us = 0;
  int64_t prefetch_us = 0;  // next-layer routing for Prefetch (set_prefetch_next_layer)
};

class MoeLayer {
 public:
  enum class Path { kResident, kReadable, kHostRouted };

  // `experts` serves every sparse layer; `store` is the same object when it is the tiered
  // ExpertStore (its residency then decides each layer's path), else null. `weights` must
  // outlive this (the routers and shared experts).
  static absl::StatusOr<std::unique_ptr<MoeLayer>> Create(
      const ModelConfig& config, const ModelWeights& weights, kernels::Backend& backend,
      std::unique_ptr<store::ExpertProvider> experts, store::ExpertStore* store);

  // Grows the scratch to hold a step of T tokens.
  absl::Status Reserve(int64_t T);
  // Before a step's first layer: forgets the ids of a step that failed before reporting them.
  void BeginStep();
  // out [T, H] = the MoE block of `layer` applied to h [T, H] (backend memory; h is the
  // post-attention-norm hidden state). Errors from expert loads name the expert and file.
  absl::Status Run(int64_t layer, int64_t T, const float* h, float* out, PhaseTimes& times);
  // After the last layer: queues the copy of the step's device-routed ids to the host.
  void QueueStepUse();
  // Once the lm head is queued: waits for that copy and reports each layer's use to the store.
  void ReportStepUse(PhaseTimes& times);

  // A dense SwiGLU MLP (dense layers, shared experts): out[t] = row_weights[t] * Mlp(x[t]).
  void DenseMlp(const kernels::ExpertWeights& mlp, float* out, const float* x, int64_t T,
                const float* row_weights);

  // The path `layer` takes this step (it pins the store's readable experts when it answers
  // kReadable; the pins last until the layer's residency changes).
  Path ChoosePath(int64_t layer);

  const store::ExpertStore* expert_store() const { return store_; }
  // True when a step can be recorded and replayed as CUDA graphs. With the tiered store too: a
  // kReadable step reads nothing back mid-step, and the host-routed path's first read ends the
  // recording; the store's loads are ordered after the step's kernels through MarkCompute, which
  // issues what is recorded first. Not while a trace is written (every step host-routed).
  bool replayable() const { return trace_ == nullptr; }
  void set_exact_timings(bool on) { exact_timings_ = on; }
  // See Model::set_routing_trace and Model::set_prefetch_next_layer.
  void set_routing_trace(store::RoutingTraceWriter* trace) {
    trace_ = trace;
    trace_step_ = -1;
  }
  void set_prefetch_next_layer(bool on) { prefetch_next_layer_ = on; }

 private:
  MoeLayer(const ModelConfig& config, const ModelWeights& weights, kernels::Backend& backend)
      : config_(config), weights_(weights), backend_(backend) {}

  absl::Status MakeResidentTables();
  // kReadable: makes the layer's device table of where its experts are, when the store's
  // residency changed; false when some expert is in neither VRAM nor a readable host tier.
  bool PrepareReadable(int64_t layer);
  // `layer`'s router on h [T, H], then Route: weights into route_, ids into `ids` ([T, K]).
  kernels::RouteArgs RouteTokens(int64_t layer, int64_t T, const float* h, int32_t* ids);
  // Backend::ExpertFfnRouted over `table` with Route's output.
  void RunRouted(const kernels::ResidentExperts& table, const kernels::RouteArgs& route, int64_t T,
                 const float* h, float* out);
  // kHostRouted with a store: ExpertFfnRouted over the experts in `pinned` (the others skipped),
  // with a pointer table staged for this call. False (nothing launched) when none is pinned or
  // their formats differ.
  bool RunPinnedRouted(const kernels::RouteArgs& route, absl::Span<const store::ExpertHandle> pinned,
                       int64_t T, const float* h, float* out);
  absl::Status RunHostRouted(int64_t layer, const kernels::RouteArgs& route, int64_t T,
                             const float* h, float* out, int64_t t0, PhaseTimes& times);
  void PrefetchNextLayer(int64_t layer, int64_t T, const float* h, PhaseTimes& times);
  int64_t Clock();  // now, in us; synchronizes first with exact timings

  const ModelConfig& config_;
  const ModelWeights& weights_;
  kernels::Backend& backend_;
  std::unique_ptr<store::ExpertProvider> experts_;
  store::ExpertStore* store_ = nullptr;  // experts_ when it is the tiered store
  bool exact_timings_ = false;
  store::RoutingTraceWriter* trace_ = nullptr;
  int64_t trace_step_ = -1;  // the running (or last) step in the trace
  bool prefetch_next_layer_ = false;

  // kResident: per layer, the experts' views and a device table of their data pointers.
  struct ResidentLayer {
    std::vector<kernels::ExpertWeights> views;
    kernels::Buffer pointers;  // [3][E]: gate, up, down data
    kernels::ResidentExperts table;
  };
  std::vector<ResidentLayer> resident_;

  // kReadable's state per layer: what the backend can read (its host-tier slots pinned until the
  // layer's next set replaces it, so never under a queued kernel), the pointer table in
  // readable_tables_, and how many ids this step routed (copied to step_ids_host_ at its end).
  struct ReadableLayer {
    store::ExpertStore::ReadableLayer readable;
    std::vector<const void*> table;  // [3][E]: gate, up, down data as uploaded
    bool any_in_host = false;        // some expert of `table` is in the host tier
    int64_t routed = 0;              // T K ids at step_ids_ + layer * step_ids_stride_
  };
  std::vector<ReadableLayer> readable_;
  kernels::Buffer readable_tables_;                // [L][3][E] device pointers
  kernels::Buffer readable_in_host_;               // [L][E] uint8: ResidentExperts::in_host
  kernels::Buffer step_ids_, step_ids_host_;       // [L][stride] int32: each layer's routed ids
  int64_t step_ids_stride_ = 0;                    // max(E, T K) of the largest step

  // RunPinnedRouted's table: views [E] (host) and gate, up, down pointers [3][E] (device);
  // the routing's copy for the host (weights, ids: [2][T, K], AllocateHost memory).
  std::vector<kernels::ExpertWeights> pinned_views_;
  kernels::Buffer pinned_table_, routed_host_;

  // Scratch for `scratch_tokens_` tokens: router logits [T, E], the shared expert's gate [T],
  // Route's output (route_: weights [T, K] float, then ids [T, K] int32, so that the host path
  // copies both in one copy) and the host plan (plan_: rows [R] int32, then their weights [R]).
  int64_t scratch_tokens_ = 0;
  kernels::Buffer router_logits_, gate_, route_, plan_;
  float* RouteWeights();
  int32_t* RouteIds(int64_t T);
};

}  // namespace moe::engine
