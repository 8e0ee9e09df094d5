// Model::Forward: embed -> per layer (attention, then MoE or dense MLP) -> norm -> lm_head.
#include "engine/model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "expertstore/checkpoint_provider.h"
#include "expertstore/manifest.h"
#include "kernels/base/clock.h"
#include "kernels/base/status.h"

namespace moe::engine {
namespace {

absl::Status Alloc(kernels::Backend& b, kernels::Buffer* buf, size_t bytes) {
  MOE_ASSIGN_OR_RETURN(*buf, b.Allocate(bytes));
  return absl::OkStatus();
}

}  // namespace

bool Model::IsStoreDir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::exists(store::ManifestPath(dir), ec);
}

int64_t ForwardItem::length() const { return kv != nullptr ? kv->length() : start; }

int64_t Model::state_bytes() const {
  return config_.StateOffset(config_.num_hidden_layers) * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<store::RoutingTraceWriter>> Model::RecordRoutingTrace(
    const std::string& path) {
  MOE_ASSIGN_OR_RETURN(auto trace, store::RoutingTraceWriter::Create(
                                       path, static_cast<int32_t>(config_.num_hidden_layers),
                                       static_cast<int32_t>(config_.num_experts)));
  set_routing_trace(trace.get());
  return trace;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   kernels::Backend& backend,
                                                   const store::StoreOptions& store) {
  if (!IsStoreDir(dir)) return Load(dir, backend, std::unique_ptr<store::ExpertProvider>());
  store::StoreOptions options = store;
  options.store_dir = dir;
  auto opened = store::ExpertStore::Open(options, &backend);
  if (!opened.ok()) return base::Annotate(opened.status(), dir);
  return Load(dir, backend, std::move(*opened));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   kernels::Backend& backend,
                                                   std::unique_ptr<store::ExpertStore> store) {
  store::ExpertStore* tiered = store.get();
  return LoadWith(dir, backend, std::move(store), tiered);
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   kernels::Backend& backend,
                                                   std::unique_ptr<store::ExpertProvider> experts) {
  return LoadWith(dir, backend, std::move(experts), nullptr);
}

absl::StatusOr<std::unique_ptr<Model>> Model::LoadWith(
    const std::string& dir, kernels::Backend& backend,
    std::unique_ptr<store::ExpertProvider> experts, store::ExpertStore* store) {
  MOE_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  if (config.clip_qkv != 0.0) {
    return absl::UnimplementedError(absl::StrCat(dir, ": clip_qkv is not supported"));
  }
  auto model = std::unique_ptr<Model>(new Model(std::move(config), backend));
  const ModelConfig& c = model->config_;
  auto ckpt = store::Checkpoint::Open(dir);
  if (!ckpt.ok()) return base::Annotate(ckpt.status(), dir);
  model->checkpoint_ = std::move(*ckpt);
  auto weights = LoadDenseWeights(c, *model->checkpoint_, backend);
  if (!weights.ok()) return base::Annotate(weights.status(), dir);
  model->weights_ = std::move(*weights);
  if (experts == nullptr) {
    auto views = LoadExpertsFromCheckpoint(c, *model->checkpoint_, backend, &model->expert_storage_);
    if (!views.ok()) return base::Annotate(views.status(), dir);
    experts = std::make_unique<store::CheckpointExpertProvider>(std::move(*views));
  }
  MOE_ASSIGN_OR_RETURN(model->moe_, MoeLayer::Create(model->config_, model->weights_, backend,
                                                     std::move(experts), store));
  model->rope_ = ComputeRopeTable(c);
  const size_t freq_bytes = model->rope_.inv_freq.size() * sizeof(float);
  MOE_RETURN_IF_ERROR(Alloc(backend, &model->inv_freq_, std::max<size_t>(freq_bytes, 1)));
  backend.CopyToDevice(model->inv_freq_.data(), model->rope_.inv_freq.data(), freq_bytes);
  return model;
}

absl::Status Model::Reserve(int64_t T) {
  if (T <= scratch_tokens_) return absl::OkStatus();
  const ModelConfig& c = config_;
  const size_t f = sizeof(float);
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_key_value_heads * c.head_dim;
  MOE_RETURN_IF_ERROR(Alloc(backend_, &x_, T * c.hidden_size * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &h_, T * c.hidden_size * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &qkv_, T * (q_dim + 2 * kv_dim) * f));
  if (T > 1 && std::any_of(weights_.layers.begin(), weights_.layers.end(),
                           [&](const LayerWeights& L) { return StacksQkv(L); })) {
    MOE_RETURN_IF_ERROR(Alloc(backend_, &qkv_rows_, T * (q_dim + 2 * kv_dim) * f));
  }
  MOE_RETURN_IF_ERROR(Alloc(backend_, &attn_, T * q_dim * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &mlp_out_, T * c.hidden_size * f));
  MOE_RETURN_IF_ERROR(moe_->Reserve(T));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &ones_, T * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &logits_, T * c.vocab_size * f));
  MOE_RETURN_IF_ERROR(Alloc(backend_, &positions_, T * sizeof(int32_t)));
  if (c.arch.attention_output_gate) MOE_RETURN_IF_ERROR(Alloc(backend_, &gate_, T * q_dim * f));
  if (c.arch.short_conv) MOE_RETURN_IF_ERROR(Alloc(backend_, &conv_, 3 * T * c.hidden_size * f));
  if (c.arch.linear_attention != LinearAttention::kNone) {
    const int64_t C = c.LinearConvChannels(), NV = c.linear_num_value_heads;
    const int64_t out = NV * c.linear_value_head_dim;
    MOE_RETURN_IF_ERROR(Alloc(backend_, &lin_mixed_, 2 * T * C * f));
    MOE_RETURN_IF_ERROR(Alloc(backend_, &lin_z_, T * out * f));
    MOE_RETURN_IF_ERROR(Alloc(backend_, &lin_ba_, 2 * T * NV * f));
    MOE_RETURN_IF_ERROR(Alloc(backend_, &lin_out_, T * out * f));
  }
  const std::vector<float> ones(T, 1.f);
  backend_.CopyToDevice(ones_.data(), ones.data(), T * f);
  scratch_tokens_ = T;
  return absl::OkStatus();
}

absl::Status Model::Forward(absl::Span<const ForwardItem> batch, bool all_positions,
                            std::vector<float>* logits) {
  MOE_ASSIGN_OR_RETURN(const int64_t R, ComputeLogits(batch, all_positions));
  const int64_t t0 = PhaseClock();
  logits->resize(R * config_.vocab_size);
  backend_.CopyToHost(logits->data(), logits_.data(), logits->size() * sizeof(float));
  times_.logits_us += PhaseClock() - t0;
  return FinishStep(batch);
}

absl::Status Model::ForwardSample(absl::Span<const ForwardItem> batch,
                                  absl::Span<const kernels::SampleParams> params,
                                  absl::Span<const kernels::PenaltyToken> penalties,
                                  std::vector<kernels::SampledToken>* tokens) {
  for (const kernels::SampleParams& p : params) {
    if (p.row < 0 || p.row >= static_cast<int64_t>(batch.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling row ", p.row, " of ", batch.size(), " items"));
    }
  }
  kernels::SampleArgs args;
  args.vocab_size = config_.vocab_size;
  args.params = params;
  args.penalties = penalties;
  MOE_RETURN_IF_ERROR(kernels::ValidateSampleArgs(args));
  MOE_RETURN_IF_ERROR(ComputeLogits(batch, false).status());
  const int64_t t0 = PhaseClock();
  tokens->resize(params.size());
  args.logits = logits_.f32();
  args.out = tokens->data();
  backend_.Sample(args);
  times_.sampling_us += PhaseClock() - t0;
  return FinishStep(batch);
}

absl::Status Model::FinishStep(absl::Span<const ForwardItem> batch) {
  backend_.EndStep();
  MOE_RETURN_IF_ERROR(backend_.TakeKvWriteError());
  MOE_RETURN_IF_ERROR(backend_.TakeRoutingError());
  for (const ForwardItem& item : batch) {
    if (item.kv != nullptr) item.kv->Advance(static_cast<int64_t>(item.tokens.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Model::ComputeLogits(absl::Span<const ForwardItem> batch,
                                             bool all_positions) {
  const ModelConfig& c = config_;
  std::vector<int32_t> ids, positions;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& item = batch[i];
    if (item.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("item ", i, ": no tokens"));
    if ((item.kv == nullptr) == (item.paged == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": needs exactly one of a contiguous or a paged KV"));
    }
    if (item.paged != nullptr) {
      const int64_t covered =
          static_cast<int64_t>(item.block_table.size()) * item.paged->block_size();
      if (item.start < 0 || item.start + static_cast<int64_t>(item.tokens.size()) > covered) {
        return absl::InvalidArgumentError(
            absl::StrCat("item ", i, ": ", item.start, " cached + ", item.tokens.size(),
                         " new tokens exceed its block table of ", covered, " positions"));
      }
      for (int32_t b : item.block_table) {
        if (b < 0 || b >= item.paged->num_blocks()) {
          return absl::InvalidArgumentError(absl::StrCat("item ", i, ": block ", b, " out of range"));
        }
      }
    } else if (item.kv->length() + static_cast<int64_t>(item.tokens.size()) > item.kv->capacity()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": ", item.kv->length(), " cached + ", item.tokens.size(),
                       " new tokens exceed the sequence's KV capacity ", item.kv->capacity()));
    }
    if (state_bytes() > 0 && (item.kv != nullptr ? item.kv->state() : item.state) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "item ", i, ": the model has linear-attention or conv layers and needs a state"));
    }
    if (item.paged != nullptr && item.paged->tail_tokens() > 0 && item.state == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": the KV cache has a 16-bit tail and needs a state for it"));
    }
    for (size_t t = 0; t < item.tokens.size(); ++t) {
      const int32_t id = item.tokens[t];
      if (id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " is outside the vocabulary [0, ", c.vocab_size, ")"));
      }
      ids.push_back(id);
      positions.push_back(static_cast<int32_t>(item.length() + t));
    }
  }
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size;
  // A KV-write or routing verdict left by a step that failed before taking it belongs to that step, whose
  // caller already got an error: dropped here, so that it is not blamed on this one.
  backend_.TakeKvWriteError().IgnoreError();
  backend_.TakeRoutingError().IgnoreError();
  MOE_RETURN_IF_ERROR(Reserve(T));
  moe_->BeginStep();
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  q_ = qkv_.f32();
  k_ = q_ + T * q_dim;
  v_ = k_ + T * c.num_key_value_heads * c.head_dim;
  // Replayable (CUDA graphs) unless an observer or exact timings read the device mid-step.
  backend_.BeginStep(T, moe_->replayable() && !observer_ && !exact_timings_);
  backend_.Embed(x_.f32(), weights_.embed_tokens.view, ids.data(), T);
  backend_.CopyToDevice(positions_.data(), positions.data(), T * sizeof(int32_t));

  // h = input_layernorm(x): for the first layer here, for the others fused with the residual
  // add that ends the layer before (AddRmsNorm).
  backend_.RmsNorm(h_.f32(), x_.f32(), T, weights_.layers[0].input_layernorm.view, c.rms_norm_eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& L = weights_.layers[l];
    int64_t t0 = PhaseClock();
    if (c.IsLinearLayer(l)) {
      LinearAttentionBlock(l, batch, T);
    } else if (c.IsConvLayer(l)) {
      ShortConvBlock(l, batch, T);
    } else if (absl::Status st = AttentionBlock(l, batch, T); !st.ok()) {
      return AbandonStep(std::move(st));
    }
    backend_.AddRmsNorm(x_.f32(), h_.f32(), h_.f32(), T, L.post_attention_layernorm.view,
                        c.rms_norm_eps);
    times_.attention_us += PhaseClock() - t0;

    if (L.sparse) {
      absl::Status st = moe_->Run(l, T, h_.f32(), mlp_out_.f32(), times_);
      if (!st.ok()) return AbandonStep(std::move(st));
      t0 = PhaseClock();
    } else {
      t0 = PhaseClock();
      moe_->DenseMlp(L.mlp, mlp_out_.f32(), h_.f32(), T, ones_.f32());
    }
    if (l + 1 < c.num_hidden_layers) {
      backend_.AddRmsNorm(x_.f32(), mlp_out_.f32(), h_.f32(), T,
                          weights_.layers[l + 1].input_layernorm.view, c.rms_norm_eps);
    } else {
      backend_.Add(x_.f32(), mlp_out_.f32(), T * H);
    }
    (L.sparse ? times_.expert_compute_us : times_.dense_us) += PhaseClock() - t0;
  }

  // The device-routed layers' ids, copied to the host in one copy read once the lm head is
  // queued (ReportStepUse).
  moe_->QueueStepUse();

  // Final norm and lm_head over the rows whose logits are wanted.
  const int64_t t0 = PhaseClock();
  std::vector<int64_t> rows;
  int64_t offset = 0;
  for (const ForwardItem& item : batch) {
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    if (all_positions) {
      for (int64_t t = 0; t < n; ++t) rows.push_back(offset + t);
    } else {
      rows.push_back(offset + n - 1);
    }
    offset += n;
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    backend_.CopyOnDevice(h_.f32() + r * H, x_.f32() + rows[r] * H, H * sizeof(float));
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  backend_.RmsNorm(h_.f32(), h_.f32(), R, weights_.norm.view, c.rms_norm_eps);
  backend_.MatMul(logits_.f32(), h_.f32(), R, weights_.lm_head.view, nullptr);
  times_.logits_us += PhaseClock() - t0;
  moe_->ReportStepUse(times_);
  return R;
}

bool Model::StacksQkv(const LayerWeights& L) const {
  return L.qkv_proj.view.data != nullptr &&
         (!config_.attention_bias || L.qkv_bias.view.data != nullptr);
}

absl::Status Model::AttentionBlock(int64_t l, absl::Span<const ForwardItem> batch, int64_t T) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[l];
  kernels::RopeArgs rope;
  rope.positions = static_cast<const int32_t*>(positions_.data());
  rope.num_tokens = T;
  rope.head_dim = static_cast<int>(c.head_dim);
  rope.rotary_dim = rope_.rotary_dim;
  rope.inv_freq = inv_freq_.f32();
  rope.attention_factor = rope_.attention_factor;
  // q, k and v in one launch where they stack. One token: its output row is [q | k | v], q_ k_
  // v_ exactly. More: rows [T, q + 2 kv] into qkv_rows_, then one pass to q_, k_ and v_ (a third
  // of the GEMM launches and one split of h_: tests/bench/NOTES.md, stop 46).
  if (StacksQkv(L)) {
    const kernels::TensorView* bias = c.attention_bias ? &L.qkv_bias.view : nullptr;
    if (T == 1) {
      backend_.MatMul(q_, h_.f32(), T, L.qkv_proj.view, bias);
    } else {
      const int64_t q_dim = c.num_attention_heads * c.head_dim;
      const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
      backend_.MatMul(qkv_rows_.f32(), h_.f32(), T, L.qkv_proj.view, bias);
      float* const parts[] = {q_, k_, v_};
      backend_.SplitColumns(qkv_rows_.f32(), T, parts, {q_dim, kv_dim, kv_dim});
    }
  } else {
    backend_.MatMul(q_, h_.f32(), T, L.q_proj.view, c.attention_bias ? &L.q_bias.view : nullptr);
    backend_.MatMul(k_, h_.f32(), T, L.k_proj.view, c.attention_bias ? &L.k_bias.view : nullptr);
    backend_.MatMul(v_, h_.f32(), T, L.v_proj.view, c.attention_bias ? &L.v_bias.view : nullptr);
  }
  kernels::RopeArgs rope_q = rope, rope_k = rope;
  rope_q.x = q_;
  rope_q.num_heads = static_cast<int>(c.num_attention_heads);
  rope_k.x = k_;
  rope_k.num_heads = static_cast<int>(c.num_key_value_heads);
  if (c.arch.qk_norm == QkNorm::kPerHead) {  // norm and rotation in one pass per tensor
    backend_.HeadNormRope(rope_q, L.q_norm.view, rope_k, L.k_norm.view, c.rms_norm_eps);
  } else {
    if (c.arch.qk_norm == QkNorm::kWholeProj) {
      backend_.RmsNorm(q_, q_, T, L.q_norm.view, c.rms_norm_eps);
      backend_.RmsNorm(k_, k_, T, L.k_norm.view, c.rms_norm_eps);
    }
    backend_.Rope(rope_q);
    backend_.Rope(rope_k);
  }
  MOE_RETURN_IF_ERROR(Attention(l, batch, T));
  if (c.arch.attention_output_gate) {
    backend_.MatMul(gate_.f32(), h_.f32(), T, L.q_gate_proj.view, nullptr);
    backend_.MulSigmoid(attn_.f32(), gate_.f32(), T * c.num_attention_heads * c.head_dim);
  }
  backend_.MatMul(h_.f32(), attn_.f32(), T, L.o_proj.view, nullptr);
  return absl::OkStatus();
}

void Model::LinearAttentionBlock(int64_t l, absl::Span<const ForwardItem> batch, int64_t T) {
  const ModelConfig& c = config_;
  const LinearAttentionWeights& W = weights_.layers[l].linear;
  const int64_t C = c.LinearConvChannels();
  const int64_t NV = c.linear_num_value_heads, DV = c.linear_value_head_dim;
  // This layer's slice of each sequence's state: conv [C, KW-1], then recurrent [NV, DK, DV].
  const int64_t offset = c.StateOffset(l);
  std::vector<kernels::LinearAttnSeq> seqs;
  for (const ForwardItem& item : batch) {
    float* state = (item.kv != nullptr ? item.kv->state() : item.state) + offset;
    seqs.push_back({static_cast<int64_t>(item.tokens.size()), state,
                    state + C * (c.linear_conv_kernel_dim - 1)});
  }
  float* mixed = lin_mixed_.f32();  // [T, C], the conv's input
  float* conv = mixed + T * C;      // [T, C]
  float* z = lin_z_.f32();          // [T, NV DV]
  float* b = lin_ba_.f32();         // [T, NV]
  float* a = b + T * NV;            // [T, NV]
  backend_.MatMul(mixed, h_.f32(), T, W.in_qkv.view, nullptr);
  backend_.MatMul(z, h_.f32(), T, W.in_z.view, nullptr);
  backend_.MatMul(b, h_.f32(), T, W.in_b.view, nullptr);
  backend_.MatMul(a, h_.f32(), T, W.in_a.view, nullptr);
  kernels::CausalConvArgs conv_args;
  conv_args.out = conv;
  conv_args.x = mixed;
  conv_args.weight = W.conv.view;
  conv_args.channels = C;
  conv_args.kernel_size = static_cast<int>(c.linear_conv_kernel_dim);
  conv_args.seqs = seqs;
  backend_.CausalConv(conv_args);
  kernels::GatedDeltaRuleArgs rule;
  rule.out = lin_out_.f32();
  rule.qkv = conv;
  rule.b = b;
  rule.a = a;
  rule.a_log = W.a_log.view;
  rule.dt_bias = W.dt_bias.view;
  rule.num_k_heads = static_cast<int>(c.linear_num_key_heads);
  rule.num_v_heads = static_cast<int>(NV);
  rule.k_head_dim = static_cast<int>(c.linear_key_head_dim);
  rule.v_head_dim = static_cast<int>(DV);
  rule.seqs = seqs;
  backend_.GatedDeltaRule(rule);
  backend_.GatedRmsNorm(lin_out_.f32(), lin_out_.f32(), z, T * NV, W.norm.view,
                        static_cast<float>(c.rms_norm_eps));
  backend_.MatMul(h_.f32(), lin_out_.f32(), T, W.out_proj.view, nullptr);
}

void Model::ShortConvBlock(int64_t l, absl::Span<const ForwardItem> batch, int64_t T) {
  const ModelConfig& c = config_;
  const ShortConvWeights& W = weights_.layers[l].conv;
  const int64_t H = c.hidden_size, offset = c.StateOffset(l);
  std::vector<kernels::LinearAttnSeq> seqs;  // conv state [H, L-1]: the last L-1 values of B * X
  for (const ForwardItem& item : batch) {
    float* state = (item.kv != nullptr ? item.kv->state() : item.state) + offset;
    seqs.push_back({static_cast<int64_t>(item.tokens.size()), state, nullptr});
  }
  auto bias = [](const kernels::DeviceTensor& t) {
    return t.view.data != nullptr ? &t.view : nullptr;
  };
  float* b = conv_.f32();  // [T, H] each
  float* gate = b + T * H;
  float* x = gate + T * H;
  backend_.MatMul(b, h_.f32(), T, W.in_b.view, bias(W.in_b_bias));
  backend_.MatMul(gate, h_.f32(), T, W.in_c.view, bias(W.in_c_bias));
  backend_.MatMul(x, h_.f32(), T, W.in_x.view, bias(W.in_x_bias));
  backend_.Mul(x, b, x, T * H);  // bx = B * X
  kernels::CausalConvArgs conv;  // depthwise causal, no activation
  conv.out = b;
  conv.x = x;
  conv.weight = W.conv.view;
  conv.bias = W.conv_bias.view;
  conv.silu = false;
  conv.channels = H;
  conv.kernel_size = static_cast<int>(c.conv_L_cache);
  conv.seqs = seqs;
  backend_.CausalConv(conv);
  backend_.Mul(b, gate, b, T * H);  // y = C * conv(bx)
  backend_.MatMul(h_.f32(), b, T, W.out_proj.view, bias(W.out_bias));
}

absl::Status Model::AbandonStep(absl::Status error) {
  backend_.EndStep();
  return error;
}

absl::Status Model::Attention(int64_t layer, absl::Span<const ForwardItem> batch, int64_t T) {
  const ModelConfig& c = config_;
  const int64_t D = c.head_dim, q_dim = c.num_attention_heads * D, kv_dim = c.num_key_value_heads * D;
  if (observer_) {
    std::vector<float> q(T * q_dim), k(T * kv_dim), v(T * kv_dim);
    backend_.CopyToHost(q.data(), q_, q.size() * sizeof(float));
    backend_.CopyToHost(k.data(), k_, k.size() * sizeof(float));
    backend_.CopyToHost(v.data(), v_, v.size() * sizeof(float));
    observer_(layer, q.data(), k.data(), v.data(), T);
  }
  // Paged items: every new K/V of the step is stored before any attention reads the cache
  // (the block manager's ordering contract: a block another item of this step shares is full).
  // Items of one cache go to the backend as one batch (one launch on CUDA); the engine gives all
  // items one cache, so a step is one write and one attention call per layer.
  std::vector<kernels::PagedKvWriteArgs> writes;
  std::vector<kernels::PagedAttentionArgs> reads;
  auto flush = [&]() -> absl::Status {
    MOE_RETURN_IF_ERROR(backend_.PagedKvWrite(writes));
    MOE_RETURN_IF_ERROR(backend_.PagedAttention(reads));
    // The tail's ring after the attention, which still reads its older positions.
    if (!writes.empty() && writes[0].kv.tail != nullptr) {
      MOE_RETURN_IF_ERROR(backend_.PagedKvTailWrite(writes));
    }
    writes.clear();
    reads.clear();
    return absl::OkStatus();
  };
  int64_t offset = 0;
  for (const ForwardItem& item : batch) {
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    if (item.paged != nullptr) {
      PagedKv& pk = *item.paged;
      if (!pk.has_codecs(layer)) {
        std::vector<float> k(T * kv_dim), v(T * kv_dim);  // the split formats' first-step sample
        backend_.CopyToHost(k.data(), k_, k.size() * sizeof(float));
        backend_.CopyToHost(v.data(), v_, v.size() * sizeof(float));
        MOE_RETURN_IF_ERROR(pk.EnsureCodecs(layer, k.data(), v.data(), T));
      }
      kernels::PagedKvWriteArgs w;
      // The tail rings follow the model's own state in the item's state.
      w.kv =
          pk.Layer(layer, item.block_table,
                   pk.tail_tokens() > 0
                       ? static_cast<void*>(reinterpret_cast<uint8_t*>(item.state) + state_bytes())
                       : nullptr);
      if (!writes.empty() && writes.back().kv.layer_base != w.kv.layer_base) {
        MOE_RETURN_IF_ERROR(flush());
      }
      w.k = k_ + offset * kv_dim;
      w.v = v_ + offset * kv_dim;
      w.num_tokens = n;
      w.start_pos = item.start;
      writes.push_back(w);
      kernels::PagedAttentionArgs a;
      a.kv = w.kv;
      a.out = attn_.f32() + offset * q_dim;
      a.q = q_ + offset * q_dim;
      a.num_tokens = n;
      a.start_pos = item.start;
      a.num_heads = static_cast<int>(c.num_attention_heads);
      a.scale = 1.f / std::sqrt(static_cast<float>(D));
      a.sliding_window = c.SlidingWindow(layer);
      a.k_new = w.k;
      a.v_new = w.v;
      reads.push_back(a);
    }
    offset += n;
  }
  MOE_RETURN_IF_ERROR(flush());
  offset = 0;
  for (const ForwardItem& item : batch) {
    const int64_t n = static_cast<int64_t>(item.tokens.size());
    if (item.paged != nullptr) {
      offset += n;
      continue;
    }
    const int64_t start = item.kv->length();
    float* k_cache = item.kv->keys(layer);
    float* v_cache = item.kv->values(layer);
    backend_.CopyOnDevice(k_cache + start * kv_dim, k_ + offset * kv_dim, n * kv_dim * sizeof(float));
    backend_.CopyOnDevice(v_cache + start * kv_dim, v_ + offset * kv_dim, n * kv_dim * sizeof(float));
    kernels::AttentionArgs a;
    a.out = attn_.f32() + offset * q_dim;
    a.q = q_ + offset * q_dim;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.num_tokens = n;
    a.start_pos = start;
    a.num_heads = static_cast<int>(c.num_attention_heads);
    a.num_kv_heads = static_cast<int>(c.num_key_value_heads);
    a.head_dim = static_cast<int>(D);
    a.scale = 1.f / std::sqrt(static_cast<float>(D));
    a.sliding_window = c.SlidingWindow(layer);
    backend_.Attention(a);
    offset += n;
  }
  return absl::OkStatus();
}

int64_t Model::PhaseClock() {
  if (exact_timings_) backend_.Synchronize();
  return base::NowMicros();
}

}  // namespace moe::engine
