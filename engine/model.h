// Model: one forward pass for every supported architecture, written against kernels::Backend:
// embedding, per layer attention then the MoE block (MoeLayer, engine/moe_layer.h) or a dense
// MLP, final norm and lm head.
//
// Legend: T tokens in the step (all sequences), H hidden, NH/NKV heads, D head dim, E experts,
// K experts per token, V vocabulary.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/moe_layer.h"
#include "engine/model_config.h"
#include "engine/paged_kv.h"
#include "engine/rope.h"
#include "engine/sequence_kv.h"
#include "engine/weights.h"
#include "expertstore/expert_provider.h"
#include "expertstore/expert_store.h"
#include "expertstore/routing_trace.h"
#include "expertstore/safetensors.h"
#include "kernels/backend.h"

namespace moe::engine {

// One sequence's share of a step. Either contiguous (`kv`: tokens are appended at kv->length())
// or paged (`paged` non-null, kv null: tokens are written at positions `start`.. of the blocks in
// `block_table`, which must cover start + tokens.size() positions; the caller tracks lengths).
struct ForwardItem {
  absl::Span<const int32_t> tokens;
  SequenceKv* kv = nullptr;
  PagedKv* paged = nullptr;
  absl::Span<const int32_t> block_table = {};
  int64_t start = 0;
  // The sequence's state when the model has linear-attention or short-conv layers
  // (Model::state_bytes(); layout: ModelConfig::StateFloats(layer) per such layer, in layer
  // order): backend memory, zeroed by its owner before the sequence's first token, advanced in
  // place by every step. Required with `paged`; a contiguous `kv` brings its own (this is then
  // ignored). A step that fails leaves it undefined: the owner recomputes or drops the sequence.
  float* state = nullptr;
  int64_t length() const;  // positions already cached before this step
};

class Model {
 public:
  // Loads config and dense weights from `dir`. Experts come from the tiered ExpertStore when
  // `dir` is a model store made by moe-import (it has manifest.json; `store` gives the budgets
  // and policy, its store_dir is set to `dir`), else straight from the checkpoint. Errors name
  // the directory and the file, tensor or budget.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     kernels::Backend& backend,
                                                     const store::StoreOptions& store = {});
  // The same with experts from `experts` (null: straight from the checkpoint in `dir`), for
  // benchmarks and tests that bring their own provider.
  static absl::StatusOr<std::unique_ptr<Model>> Load(
      const std::string& dir, kernels::Backend& backend,
      std::unique_ptr<store::ExpertProvider> experts);
  // The same with an opened tiered store (its residency decides each layer's path: MoeLayer).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     kernels::Backend& backend,
                                                     std::unique_ptr<store::ExpertStore> store);
  // True when `dir` is a finished model store.
  static bool IsStoreDir(const std::string& dir);

  const ModelConfig& config() const { return config_; }
  // Bytes of one sequence's state (ForwardItem::state): 0 without linear or conv layers.
  int64_t state_bytes() const;
  kernels::Backend& backend() const { return backend_; }

  // Runs every item's tokens through the model, appends their keys/values and fills `logits`
  // (host memory): with all_positions one row of V per token in item order, else one row per
  // item for its last token. InvalidArgument: a token id outside the vocabulary, a sequence that
  // would pass its KV capacity, an empty item. Errors from expert loads are returned as they are
  // (they name the expert and file), as is InvalidArgument for a key or value the KV format
  // rejects (non-finite; names the position) or for a routing fault (non-finite router logits,
  // an expert id out of range: names the layer, Backend::TakeRoutingError); the items' lengths
  // then do not advance.
  absl::Status Forward(absl::Span<const ForwardItem> batch, bool all_positions,
                       std::vector<float>* logits);
  // Forward for each item's last token, then the next tokens drawn where the logits are
  // (Backend::Sample): only `tokens` ([params.size()], host) cross to the host. params[i].row
  // names an item. InvalidArgument, before any work, for a row or penalty entry out of range, a
  // penalty token outside the vocabulary; else Forward's errors.
  absl::Status ForwardSample(absl::Span<const ForwardItem> batch,
                             absl::Span<const kernels::SampleParams> params,
                             absl::Span<const kernels::PenaltyToken> penalties,
                             std::vector<kernels::SampledToken>* tokens);

  const PhaseTimes& phase_times() const { return times_; }
  // Synchronizes the backend at every phase boundary, so that each phase's time is its device
  // time (plus one synchronization): slower, for breakdowns (moe-bench --timings).
  void set_exact_timings(bool on) {
    exact_timings_ = on;
    moe_->set_exact_timings(on);
  }
  // The tiered store serving the experts, or null when they come from the checkpoint.
  const store::ExpertStore* expert_store() const { return moe_->expert_store(); }
  // ExpertStore::Preload for a store-backed model (0 for any other): the VRAM tier filled at
  // start when it holds every expert.
  absl::StatusOr<int64_t> PreloadExperts(const std::function<void(int32_t layers_done)>& progress) {
    return moe_->PreloadExperts(progress);
  }

  // Debugging and quality tools (kv-quality): called once per layer of every Forward with host
  // copies of the step's post-RoPE, post-q/k-norm q [T, NH, D], k and v [T, NKV, D]. Empty: none.
  using AttentionObserver =
      std::function<void(int64_t layer, const float* q, const float* k, const float* v, int64_t T)>;
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

  // Routing traces for moe-store-sim (format in expertstore/routing_trace.h). While set, every
  // Forward appends one record per MoE layer: the step (Forward calls since the writer was set,
  // from 0; a failed Forward keeps its number and may leave some of its layers), the layer, and
  // the experts the batch needed, ascending: the set and order Acquire is called with. The
  // writer must outlive its use; the caller flushes it. Null (the default) records nothing.
  void set_routing_trace(store::RoutingTraceWriter* trace) { moe_->set_routing_trace(trace); }
  // A writer at `path` sized for this model, already set as the routing trace (above); the
  // caller keeps it alive while the model runs.
  absl::StatusOr<std::unique_ptr<store::RoutingTraceWriter>> RecordRoutingTrace(
      const std::string& path);

  // Prefetch of the next layer's likely experts. When on and the experts come from the tiered
  // ExpertStore (expert_store() non-null; otherwise it does nothing), each MoE layer, once its
  // own experts are acquired (pinned, so never the victims), applies the next layer's router to
  // its post-attention-norm hidden state, takes the top-k per token on the host (one more host
  // copy per layer, timed as PhaseTimes::prefetch_us) and calls ExpertStore::Prefetch for their
  // union in layer + 1. Its accuracy is StoreStats::prefetch_used / prefetch_issued. It changes
  // only residency, which can reorder the sum over experts (see MoeBlock): results agree to the
  // last bits, as between budgets. Default: off.
  void set_prefetch_next_layer(bool on) { moe_->set_prefetch_next_layer(on); }

 private:
  Model(ModelConfig config, kernels::Backend& backend) : config_(std::move(config)), backend_(backend) {}

  // The layers, final norm and lm head: logits_ holds R rows (returned) of V.
  absl::StatusOr<int64_t> ComputeLogits(absl::Span<const ForwardItem> batch, bool all_positions);
  // The step's KV-write verdict; on success the contiguous caches' lengths advance.
  absl::Status FinishStep(absl::Span<const ForwardItem> batch);
  // Returns `error` for a step that fails half-way, its work issued (Backend::EndStep).
  absl::Status AbandonStep(absl::Status error);
  // Layer `layer`'s token mixer on h_ (the normed input), its output (before the residual add)
  // into h_: full attention (projections, q/k norms, RoPE, the KV write and attention, the output
  // gate, o_proj), GatedDeltaNet (projections, causal conv, delta rule, gated norm, out_proj) or
  // LFM2's short conv.
  absl::Status AttentionBlock(int64_t layer, absl::Span<const ForwardItem> batch, int64_t T);
  // Whether layer L's q, k and v (and their biases, if any) stack: one projection for the three.
  bool StacksQkv(const LayerWeights& L) const;
  void LinearAttentionBlock(int64_t layer, absl::Span<const ForwardItem> batch, int64_t T);
  // LFM2's short conv: B, C, X = h in_proj, out_proj(C * conv(B * X)) into h_.
  void ShortConvBlock(int64_t layer, absl::Span<const ForwardItem> batch, int64_t T);
  // The KV write and attention over the cache: q_/k_/v_ -> attn_.
  absl::Status Attention(int64_t layer, absl::Span<const ForwardItem> batch, int64_t T);
  // Grows the scratch buffers to hold a step of T tokens.
  absl::Status Reserve(int64_t T);
  static absl::StatusOr<std::unique_ptr<Model>> LoadWith(
      const std::string& dir, kernels::Backend& backend,
      std::unique_ptr<store::ExpertProvider> experts, store::ExpertStore* store);

  ModelConfig config_;
  kernels::Backend& backend_;
  std::unique_ptr<store::Checkpoint> checkpoint_;
  ModelWeights weights_;
  std::vector<kernels::DeviceTensor> expert_storage_;
  std::unique_ptr<MoeLayer> moe_;  // the sparse layers, with the expert provider
  RopeTable rope_;
  PhaseTimes times_;
  bool exact_timings_ = false;
  int64_t PhaseClock();  // now, in us; synchronizes first with exact_timings_
  AttentionObserver observer_;

  // Scratch in backend memory, sized for `scratch_tokens_` tokens.
  int64_t scratch_tokens_ = 0;
  kernels::Buffer x_, h_, qkv_, attn_, mlp_out_, ones_, logits_, positions_;
  kernels::Buffer gate_;  // [T, NH*D], attention_output_gate
  // GatedDeltaNet: conv input and output [T, C] each, z [T, NV DV], b and a [T, NV] each, the
  // delta rule's output [T, NV DV].
  kernels::Buffer lin_mixed_, lin_z_, lin_ba_, lin_out_;
  // Short conv: B (then the conv's output), C and X (then B * X), [T, H] each.
  kernels::Buffer conv_;
  // The step's q [T, NH*D], k and v [T, NKV*D], one after another in qkv_ (set per Forward): at
  // T = 1 that is exactly one row of the fused projection's output, [q | k | v].
  float* q_ = nullptr;
  float* k_ = nullptr;
  float* v_ = nullptr;
  kernels::Buffer inv_freq_;  // rope_.inv_freq in backend memory
  // [T, q + 2 kv]: the stacked projection's output at T > 1, where a layer stacks (StacksQkv).
  kernels::Buffer qkv_rows_;
};

}  // namespace moe::engine
