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
    MOE_ASSIGN_OR_RETURN(L.q_proj, load.Get(attn + "q_proj.weight", {q_dim, H}));
    MOE_ASSIGN_OR_RETURN(L.k_proj, load.Get(attn + "k_proj.weight", {kv_dim, H}));
    MOE_ASSIGN_OR_RETURN(L.v_proj, load.Get(attn + "v_proj.weight", {kv_dim, H}));
    MOE_ASSIGN_OR_RETURN(L.o_proj, load.Get(attn + "o_proj.weight", {H, q_dim}));
    if (c.attention_bias) {
      MOE_ASSIGN_OR_RETURN(L.q_bias, load.Get(attn + "q_proj.bias", {q_dim}));
      MOE_ASSIGN_OR_RETURN(L.k_bias, load.Get(attn + "k_proj.bias", {kv_dim}));
      MOE_ASSIGN_OR_RETURN(L.v_bias, load.Get(attn + "v_proj.bias", {kv_dim}));
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
