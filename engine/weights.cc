// LoadDenseWeights / LoadExpertsFromCheckpoint: names from the architecture, shapes from config.
#include "engine/weights.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

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
  MOE_ASSIGN_OR_RETURN(w.norm, load.Get("model.norm.weight", {H}));
  if (c.tie_word_embeddings && !load.Has("lm_head.weight")) {
    MOE_ASSIGN_OR_RETURN(w.lm_head, load.Get("model.embed_tokens.weight", {V, H}));
  } else {
    MOE_ASSIGN_OR_RETURN(w.lm_head, load.Get("lm_head.weight", {V, H}));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string attn = p + "self_attn.";
    MOE_ASSIGN_OR_RETURN(L.input_layernorm, load.Get(p + "input_layernorm.weight", {H}));
    MOE_ASSIGN_OR_RETURN(L.post_attention_layernorm,
                         load.Get(p + "post_attention_layernorm.weight", {H}));
    MOE_ASSIGN_OR_RETURN(L.qkv_proj, load.GetStacked({attn + "q_proj.weight", attn + "k_proj.weight",
                                                      attn + "v_proj.weight"},
                                                     {{q_dim, H}, {kv_dim, H}, {kv_dim, H}},
                                                     {&L.q_proj, &L.k_proj, &L.v_proj}));
    if (L.qkv_proj.view.data == nullptr) {
      MOE_ASSIGN_OR_RETURN(L.q_proj, load.Get(attn + "q_proj.weight", {q_dim, H}));
      MOE_ASSIGN_OR_RETURN(L.k_proj, load.Get(attn + "k_proj.weight", {kv_dim, H}));
      MOE_ASSIGN_OR_RETURN(L.v_proj, load.Get(attn + "v_proj.weight", {kv_dim, H}));
    }
    MOE_ASSIGN_OR_RETURN(L.o_proj, load.Get(attn + "o_proj.weight", {H, q_dim}));
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
      MOE_ASSIGN_OR_RETURN(L.q_norm, load.Get(attn + "q_norm.weight", {D}));
      MOE_ASSIGN_OR_RETURN(L.k_norm, load.Get(attn + "k_norm.weight", {D}));
    } else if (c.arch.qk_norm == QkNorm::kWholeProj) {
      MOE_ASSIGN_OR_RETURN(L.q_norm, load.Get(attn + "q_norm.weight", {q_dim}));
      MOE_ASSIGN_OR_RETURN(L.k_norm, load.Get(attn + "k_norm.weight", {kv_dim}));
    }
    L.sparse = c.IsSparseLayer(l);
    const std::string mlp = p + c.arch.moe_block + ".";
    if (L.sparse) {
      MOE_ASSIGN_OR_RETURN(L.router, load.Get(mlp + "gate.weight", {c.num_experts, H}));
      if (c.arch.has_shared_expert) {
        const int64_t I = c.shared_expert_intermediate_size;
        MOE_ASSIGN_OR_RETURN(L.mlp_gate, load.Get(mlp + "shared_expert.gate_proj.weight", {I, H}));
        MOE_ASSIGN_OR_RETURN(L.mlp_up, load.Get(mlp + "shared_expert.up_proj.weight", {I, H}));
        MOE_ASSIGN_OR_RETURN(L.mlp_down, load.Get(mlp + "shared_expert.down_proj.weight", {H, I}));
        MOE_ASSIGN_OR_RETURN(L.shared_expert_gate, load.Get(mlp + "shared_expert_gate.weight", {1, H}));
        L.mlp = Views(L.mlp_gate, L.mlp_up, L.mlp_down);
      }
    } else {
      const int64_t I = c.intermediate_size;
      const std::string dense = p + "mlp.";
      MOE_ASSIGN_OR_RETURN(L.mlp_gate, load.Get(dense + "gate_proj.weight", {I, H}));
      MOE_ASSIGN_OR_RETURN(L.mlp_up, load.Get(dense + "up_proj.weight", {I, H}));
      MOE_ASSIGN_OR_RETURN(L.mlp_down, load.Get(dense + "down_proj.weight", {H, I}));
      L.mlp = Views(L.mlp_gate, L.mlp_up, L.mlp_down);
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
