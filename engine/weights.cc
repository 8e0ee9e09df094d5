// LoadDenseWeights / LoadExpertsFromCheckpoint: names from the architecture, shapes from config.
#include "engine/weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"
#include "kernels/quant.h"

namespace moe::engine {
namespace {

class Loader {
 public:
  Loader(const store::Checkpoint& c, kernels::Backend& b) : checkpoint_(c), backend_(b) {}

  absl::StatusOr<kernels::DeviceTensor> Get(const std::string& name,
                                            const std::vector<int64_t>& shape) {
    MOE_ASSIGN_OR_RETURN(kernels::TensorView host, checkpoint_.Get(name, shape));
    return backend_.Upload(host);
  }
  bool Has(const std::string& name) const { return checkpoint_.Has(name); }

  // A new tensor made of the rows `rows` of the checkpoint's `name` (shape `shape`, rows first),
  // in that order: the layouts that interleave two matrices' rows (gated attention's q_proj,
  // Qwen3-Next's grouped projections) become plain matrices once, at load.
  absl::StatusOr<kernels::DeviceTensor> GetRows(const std::string& name,
                                                const std::vector<int64_t>& shape,
                                                const std::vector<int64_t>& rows) {
    MOE_ASSIGN_OR_RETURN(kernels::TensorView host, checkpoint_.Get(name, shape));
    const auto* src = static_cast<const uint8_t*>(host.data);
    std::vector<uint8_t> gathered;  // one copy to the device, not one a row
    if (kernels::IsQuantized(host.dtype)) {
      // A quantized matrix (quant.h) is codes [rows, RowBytes] then params [rows, groups, 2]:
      // both gathered by row, into the layout of the smaller matrix.
      if (host.rank != 2) {
        return absl::UnimplementedError(absl::StrCat("tensor '", name, "': quantized, not 2-D"));
      }
      const int64_t cols = shape[1], n = static_cast<int64_t>(rows.size());
      const int64_t code_bytes = kernels::QuantRowBytes(host.dtype, cols);
      const int64_t param_bytes = kernels::QuantGroups(cols, host.group_size) * 4;
      gathered.assign(kernels::QuantizedBytes(host.dtype, n, cols, host.group_size), 0);
      const uint8_t* params = src + kernels::QuantParamsOffset(host.dtype, shape[0], cols);
      uint8_t* out_params = gathered.data() + kernels::QuantParamsOffset(host.dtype, n, cols);
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(gathered.data() + i * code_bytes, src + rows[i] * code_bytes, code_bytes);
        std::memcpy(out_params + i * param_bytes, params + rows[i] * param_bytes, param_bytes);
      }
    } else {
      const size_t row_bytes = host.bytes() / shape[0];
      gathered.resize(rows.size() * row_bytes);
      for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(gathered.data() + i * row_bytes, src + rows[i] * row_bytes, row_bytes);
      }
    }
    MOE_ASSIGN_OR_RETURN(kernels::Buffer storage, backend_.Allocate(gathered.size()));
    backend_.CopyToDevice(storage.data(), gathered.data(), gathered.size());
    kernels::DeviceTensor out;
    out.view = host;
    out.view.data = storage.data();
    out.view.shape[0] = static_cast<int64_t>(rows.size());
    out.storage = std::move(storage);
    return out;
  }

  // A norm weight as used: fp32 (1 + w) for the zero-centred norms (transformers computes
  // 1.0 + weight.float() the same way), w itself otherwise.
  absl::StatusOr<kernels::DeviceTensor> GetNorm(const std::string& name, int64_t n,
                                                bool zero_centred) {
    if (!zero_centred) return Get(name, {n});
    return GetF32(name, n, 1.f);
  }

  // The vector `name` [n] as fp32, plus `offset`: what the kernels read as float*.
  absl::StatusOr<kernels::DeviceTensor> GetF32(const std::string& name, int64_t n, float offset) {
    MOE_ASSIGN_OR_RETURN(kernels::TensorView host, checkpoint_.Get(name, {n}));
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = offset + host.at(i);
    MOE_ASSIGN_OR_RETURN(kernels::Buffer storage, backend_.Allocate(n * sizeof(float)));
    backend_.CopyToDevice(storage.data(), w.data(), n * sizeof(float));
    kernels::DeviceTensor out;
    out.view = host;
    out.view.dtype = kernels::DType::kF32;
    out.view.data = storage.data();
    out.storage = std::move(storage);
    return out;
  }

  // The tensors `names` (shapes [rows_i, cols...]) stacked along their first dim into one upload,
  // with `parts` set to views of their rows in it; an empty tensor (nothing uploaded) when their
  // dtypes differ or are quantized (a quantized matrix keeps its scales after all its codes, so
  // rows of two matrices do not stack), and on the CPU backend: it computes on the mapped
  // checkpoint without a copy, and one matrix in place of three saves it nothing (stacking would
  // copy a bf16 Qwen3-30B-A3B's attention projections, ~1.8 GB, for no gain).
  absl::StatusOr<kernels::DeviceTensor> GetStacked(
      const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes,
      std::vector<kernels::DeviceTensor*> parts) {
    if (backend_.kind() == kernels::BackendKind::kCpu) return kernels::DeviceTensor{};
    std::vector<kernels::TensorView> host;
    int64_t rows = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      MOE_ASSIGN_OR_RETURN(host.emplace_back(), checkpoint_.Get(names[i], shapes[i]));
      if (kernels::IsQuantized(host[i].dtype) || host[i].dtype != host[0].dtype) {
        return kernels::DeviceTensor{};
      }
      rows += shapes[i][0];
    }
    size_t total = 0;
    for (const kernels::TensorView& h : host) total += h.bytes();
    MOE_ASSIGN_OR_RETURN(kernels::Buffer storage, backend_.Allocate(total));
    kernels::DeviceTensor out;
    out.view = host[0];
    out.view.data = storage.data();
    out.view.shape[0] = rows;
    size_t offset = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      auto* at = static_cast<uint8_t*>(storage.data()) + offset;
      backend_.CopyToDevice(at, host[i].data, host[i].bytes());
      parts[i]->view = host[i];
      parts[i]->view.data = at;
      offset += host[i].bytes();
    }
    out.storage = std::move(storage);
    return out;
  }

 private:
  const store::Checkpoint& checkpoint_;
  kernels::Backend& backend_;
};

kernels::ExpertWeights Views(const kernels::DeviceTensor& gate, const kernels::DeviceTensor& up,
                             const kernels::DeviceTensor& down) {
  return kernels::ExpertWeights{gate.view, up.view, down.view};
}

// The layer's dense MLP, or its router and shared expert (sparse layers).
absl::Status LoadMlp(const ModelConfig& c, int64_t l, Loader& load, LayerWeights* L) {
  const int64_t H = c.hidden_size;
  const std::string p = absl::StrCat("model.layers.", l, ".");
  const std::string mlp = p + c.arch.moe_block + ".";
  if (L->sparse) {
    MOE_ASSIGN_OR_RETURN(L->router, load.Get(mlp + "gate.weight", {c.num_experts, H}));
    if (c.arch.sigmoid_routing && c.use_expert_bias) {  // a buffer; LFM2.5 names it .weight
      const std::string bias = mlp + "expert_bias";
      if (!load.Has(bias) && !load.Has(bias + ".weight")) {
        return absl::NotFoundError(absl::StrCat("tensor '", bias, "' (or '", bias,
                                                ".weight') not found: use_expert_bias is true"));
      }
      MOE_ASSIGN_OR_RETURN(L->expert_bias, load.GetF32(load.Has(bias) ? bias : bias + ".weight",
                                                       c.num_experts, 0.f));
    }
    if (c.arch.has_shared_expert) {
      const int64_t I = c.shared_expert_intermediate_size;
      MOE_ASSIGN_OR_RETURN(L->mlp_gate, load.Get(mlp + "shared_expert.gate_proj.weight", {I, H}));
      MOE_ASSIGN_OR_RETURN(L->mlp_up, load.Get(mlp + "shared_expert.up_proj.weight", {I, H}));
      MOE_ASSIGN_OR_RETURN(L->mlp_down, load.Get(mlp + "shared_expert.down_proj.weight", {H, I}));
      MOE_ASSIGN_OR_RETURN(L->shared_expert_gate,
                           load.Get(mlp + "shared_expert_gate.weight", {1, H}));
      L->mlp = Views(L->mlp_gate, L->mlp_up, L->mlp_down);
    }
    return absl::OkStatus();
  }
  const int64_t I = c.intermediate_size;
  const Architecture& a = c.arch;
  const std::string dense = p + a.dense_block + ".";
  MOE_ASSIGN_OR_RETURN(L->mlp_gate, load.Get(dense + a.dense_gate + ".weight", {I, H}));
  MOE_ASSIGN_OR_RETURN(L->mlp_up, load.Get(dense + a.dense_up + ".weight", {I, H}));
  MOE_ASSIGN_OR_RETURN(L->mlp_down, load.Get(dense + a.dense_down + ".weight", {H, I}));
  L->mlp = Views(L->mlp_gate, L->mlp_up, L->mlp_down);
  return absl::OkStatus();
}

// GatedDeltaNet's tensors below `p` ("model.layers.{i}.linear_attn."), architectures.md §1.4;
// Qwen3-Next's grouped in_proj_qkvz / in_proj_ba (§2) are regrouped into the same four matrices.
absl::Status LoadLinearAttention(const ModelConfig& c, const std::string& p, Loader& load,
                                 LinearAttentionWeights* W) {
  const int64_t H = c.hidden_size, NK = c.linear_num_key_heads, NV = c.linear_num_value_heads;
  const int64_t DK = c.linear_key_head_dim, DV = c.linear_value_head_dim, r = NV / NK;
  const int64_t C = c.LinearConvChannels();
  if (c.arch.linear_attention == LinearAttention::kGrouped) {
    // in_proj_qkvz rows per key head g: q_g [DK], k_g [DK], v [r DV], z [r DV];
    // in_proj_ba rows per key head g: b [r], a [r].
    const int64_t group = 2 * DK + 2 * r * DV;
    std::vector<int64_t> qkv, z, b, a;
    for (int64_t g = 0; g < NK; ++g) {
      for (int64_t d = 0; d < DK; ++d) qkv.push_back(g * group + d);
    }
    for (int64_t g = 0; g < NK; ++g) {
      for (int64_t d = 0; d < DK; ++d) qkv.push_back(g * group + DK + d);
    }
    for (int64_t g = 0; g < NK; ++g) {
      for (int64_t d = 0; d < r * DV; ++d) {
        qkv.push_back(g * group + 2 * DK + d);
        z.push_back(g * group + 2 * DK + r * DV + d);
      }
      for (int64_t j = 0; j < r; ++j) {
        b.push_back(g * 2 * r + j);
        a.push_back(g * 2 * r + r + j);
      }
    }
    const std::vector<int64_t> qkvz_shape = {NK * group, H}, ba_shape = {2 * NV, H};
    MOE_ASSIGN_OR_RETURN(W->in_qkv, load.GetRows(p + "in_proj_qkvz.weight", qkvz_shape, qkv));
    MOE_ASSIGN_OR_RETURN(W->in_z, load.GetRows(p + "in_proj_qkvz.weight", qkvz_shape, z));
    MOE_ASSIGN_OR_RETURN(W->in_b, load.GetRows(p + "in_proj_ba.weight", ba_shape, b));
    MOE_ASSIGN_OR_RETURN(W->in_a, load.GetRows(p + "in_proj_ba.weight", ba_shape, a));
  } else {
    MOE_ASSIGN_OR_RETURN(W->in_qkv, load.Get(p + "in_proj_qkv.weight", {C, H}));
    MOE_ASSIGN_OR_RETURN(W->in_z, load.Get(p + "in_proj_z.weight", {NV * DV, H}));
    MOE_ASSIGN_OR_RETURN(W->in_b, load.Get(p + "in_proj_b.weight", {NV, H}));
    MOE_ASSIGN_OR_RETURN(W->in_a, load.Get(p + "in_proj_a.weight", {NV, H}));
  }
  MOE_ASSIGN_OR_RETURN(W->conv, load.Get(p + "conv1d.weight", {C, 1, c.linear_conv_kernel_dim}));
  MOE_ASSIGN_OR_RETURN(W->a_log, load.Get(p + "A_log", {NV}));
  MOE_ASSIGN_OR_RETURN(W->dt_bias, load.Get(p + "dt_bias", {NV}));
  MOE_ASSIGN_OR_RETURN(W->norm, load.Get(p + "norm.weight", {DV}));
  MOE_ASSIGN_OR_RETURN(W->out_proj, load.Get(p + "out_proj.weight", {H, NV * DV}));
  return absl::OkStatus();
}

// LFM2's short conv below `p` ("model.layers.{i}.conv."): in_proj's rows B | C | X, in order.
absl::Status LoadShortConv(const ModelConfig& c, const std::string& p, Loader& load,
                           ShortConvWeights* W) {
  const int64_t H = c.hidden_size;
  std::vector<int64_t> rows[3];
  for (int part = 0; part < 3; ++part) {
    for (int64_t r = 0; r < H; ++r) rows[part].push_back(part * H + r);
  }
  kernels::DeviceTensor* in[3] = {&W->in_b, &W->in_c, &W->in_x};
  kernels::DeviceTensor* in_bias[3] = {&W->in_b_bias, &W->in_c_bias, &W->in_x_bias};
  for (int part = 0; part < 3; ++part) {
    MOE_ASSIGN_OR_RETURN(*in[part], load.GetRows(p + "in_proj.weight", {3 * H, H}, rows[part]));
    if (c.conv_bias) {
      MOE_ASSIGN_OR_RETURN(*in_bias[part], load.GetRows(p + "in_proj.bias", {3 * H}, rows[part]));
    }
  }
  MOE_ASSIGN_OR_RETURN(W->conv, load.Get(p + "conv.weight", {H, 1, c.conv_L_cache}));
  MOE_ASSIGN_OR_RETURN(W->out_proj, load.Get(p + "out_proj.weight", {H, H}));
  if (c.conv_bias) {
    MOE_ASSIGN_OR_RETURN(W->conv_bias, load.Get(p + "conv.bias", {H}));
    MOE_ASSIGN_OR_RETURN(W->out_bias, load.Get(p + "out_proj.bias", {H}));
  }
  return absl::OkStatus();
}

}  // namespace

store::ExpertTensorNames ExpertNames(const ModelConfig& c, int64_t layer, int64_t expert) {
  const std::string p = absl::StrCat("model.layers.", layer, ".", c.arch.moe_block, ".experts.",
                                     expert, ".");
  return {static_cast<int32_t>(layer), static_cast<int32_t>(expert),
          absl::StrCat(p, c.arch.expert_gate, ".weight"), absl::StrCat(p, c.arch.expert_up, ".weight"),
          absl::StrCat(p, c.arch.expert_down, ".weight")};
}

absl::StatusOr<ModelWeights> LoadDenseWeights(const ModelConfig& c,
                                              const store::Checkpoint& checkpoint,
                                              kernels::Backend& backend) {
  Loader load(checkpoint, backend);
  const int64_t H = c.hidden_size, V = c.vocab_size, D = c.head_dim;
  const int64_t q_dim = c.num_attention_heads * D, kv_dim = c.num_key_value_heads * D;
  ModelWeights w;
  MOE_ASSIGN_OR_RETURN(w.embed_tokens, load.Get("model.embed_tokens.weight", {V, H}));
  const bool zc = c.arch.zero_centred_norms;
  const Architecture& a = c.arch;
  MOE_ASSIGN_OR_RETURN(w.norm, load.GetNorm("model." + a.final_norm + ".weight", H, zc));
  if (c.tie_word_embeddings && !load.Has("lm_head.weight")) {
    MOE_ASSIGN_OR_RETURN(w.lm_head, load.Get("model.embed_tokens.weight", {V, H}));
  } else {
    MOE_ASSIGN_OR_RETURN(w.lm_head, load.Get("lm_head.weight", {V, H}));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string attn = p + "self_attn.";
    MOE_ASSIGN_OR_RETURN(L.input_layernorm, load.GetNorm(p + a.input_norm + ".weight", H, zc));
    MOE_ASSIGN_OR_RETURN(L.post_attention_layernorm,
                         load.GetNorm(p + a.post_attention_norm + ".weight", H, zc));
    L.sparse = c.IsSparseLayer(l);
    MOE_RETURN_IF_ERROR(LoadMlp(c, l, load, &L));
    if (c.IsLinearLayer(l)) {
      MOE_RETURN_IF_ERROR(LoadLinearAttention(c, p + "linear_attn.", load, &L.linear));
      continue;
    }
    if (c.IsConvLayer(l)) {
      MOE_RETURN_IF_ERROR(LoadShortConv(c, p + "conv.", load, &L.conv));
      continue;
    }
    if (c.arch.attention_output_gate) {  // q_proj rows per head: D query rows, then D gate rows
      std::vector<int64_t> query, gate;
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        for (int64_t d = 0; d < D; ++d) {
          query.push_back(2 * h * D + d);
          gate.push_back(2 * h * D + D + d);
        }
      }
      MOE_ASSIGN_OR_RETURN(L.q_proj, load.GetRows(attn + "q_proj.weight", {2 * q_dim, H}, query));
      MOE_ASSIGN_OR_RETURN(L.q_gate_proj,
                           load.GetRows(attn + "q_proj.weight", {2 * q_dim, H}, gate));
      if (c.attention_bias) {
        return absl::UnimplementedError(
            absl::StrCat(attn, "q_proj: attention_bias with the output gate"));
      }
      MOE_ASSIGN_OR_RETURN(L.k_proj, load.Get(attn + "k_proj.weight", {kv_dim, H}));
      MOE_ASSIGN_OR_RETURN(L.v_proj, load.Get(attn + "v_proj.weight", {kv_dim, H}));
    } else {
      MOE_ASSIGN_OR_RETURN(
          L.qkv_proj,
          load.GetStacked({attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"},
                          {{q_dim, H}, {kv_dim, H}, {kv_dim, H}},
                          {&L.q_proj, &L.k_proj, &L.v_proj}));
      if (L.qkv_proj.view.data == nullptr) {
        MOE_ASSIGN_OR_RETURN(L.q_proj, load.Get(attn + "q_proj.weight", {q_dim, H}));
        MOE_ASSIGN_OR_RETURN(L.k_proj, load.Get(attn + "k_proj.weight", {kv_dim, H}));
        MOE_ASSIGN_OR_RETURN(L.v_proj, load.Get(attn + "v_proj.weight", {kv_dim, H}));
      }
    }
    MOE_ASSIGN_OR_RETURN(L.o_proj, load.Get(attn + a.o_proj + ".weight", {H, q_dim}));
    if (c.attention_bias) {
      MOE_ASSIGN_OR_RETURN(L.qkv_bias, load.GetStacked({attn + "q_proj.bias", attn + "k_proj.bias",
                                                        attn + "v_proj.bias"},
                                                       {{q_dim}, {kv_dim}, {kv_dim}},
                                                       {&L.q_bias, &L.k_bias, &L.v_bias}));
      if (L.qkv_bias.view.data == nullptr) {
        MOE_ASSIGN_OR_RETURN(L.q_bias, load.Get(attn + "q_proj.bias", {q_dim}));
        MOE_ASSIGN_OR_RETURN(L.k_bias, load.Get(attn + "k_proj.bias", {kv_dim}));
        MOE_ASSIGN_OR_RETURN(L.v_bias, load.Get(attn + "v_proj.bias", {kv_dim}));
      }
    }
    if (c.arch.qk_norm == QkNorm::kPerHead) {
      MOE_ASSIGN_OR_RETURN(L.q_norm, load.GetNorm(attn + a.q_norm + ".weight", D, zc));
      MOE_ASSIGN_OR_RETURN(L.k_norm, load.GetNorm(attn + a.k_norm + ".weight", D, zc));
    } else if (c.arch.qk_norm == QkNorm::kWholeProj) {
      MOE_ASSIGN_OR_RETURN(L.q_norm, load.Get(attn + "q_norm.weight", {q_dim}));
      MOE_ASSIGN_OR_RETURN(L.k_norm, load.Get(attn + "k_norm.weight", {kv_dim}));
    }
  }
  return w;
}

absl::StatusOr<std::vector<std::vector<kernels::ExpertWeights>>> LoadExpertsFromCheckpoint(
    const ModelConfig& c, const store::Checkpoint& checkpoint, kernels::Backend& backend,
    std::vector<kernels::DeviceTensor>* storage) {
  Loader load(checkpoint, backend);
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  std::vector<std::vector<kernels::ExpertWeights>> experts(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsSparseLayer(l)) continue;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const store::ExpertTensorNames names = ExpertNames(c, l, e);
      MOE_ASSIGN_OR_RETURN(kernels::DeviceTensor gate, load.Get(names.gate, {I, H}));
      MOE_ASSIGN_OR_RETURN(kernels::DeviceTensor up, load.Get(names.up, {I, H}));
      MOE_ASSIGN_OR_RETURN(kernels::DeviceTensor down, load.Get(names.down, {H, I}));
      experts[l].push_back(Views(gate, up, down));
      storage->push_back(std::move(gate));
      storage->push_back(std::move(up));
      storage->push_back(std::move(down));
    }
  }
  return experts;
}

}  // namespace moe::engine
