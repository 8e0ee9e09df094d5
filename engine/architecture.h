// Architecture: everything that differs between the MoE families we run, as data. One forward
// pass reads it; adding a family is adding a row to the table in architecture.cc.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moe::engine {

enum class QkNorm {
  kNone,       // mixtral, qwen2_moe
  kPerHead,    // qwen3_moe: RMSNorm over head_dim of each head, before RoPE
  kWholeProj,  // olmoe: RMSNorm over the whole q (k) projection, before splitting into heads
};

// Which layers config.json's sliding_window applies to, as transformers reads each family.
enum class SlidingWindowRule {
  kNone,       // olmoe: no sliding-window attention (sliding_window is not a field of the family)
  kAllLayers,  // mixtral: sliding_window, when set, windows every layer
  kGated,      // qwen3_moe: only with use_sliding_window (default false), then every layer
  kPerLayer,   // qwen2_moe: gated like kGated, and only on the layers layer_types names
               // "sliding_attention" (without layer_types: layer >= max_window_layers)
};

// GatedDeltaNet linear attention (architectures.md §1.5.3): which input projections hold it.
enum class LinearAttention {
  kNone,
  kSeparate,  // qwen3_5_moe: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
  kGrouped,   // qwen3_next: in_proj_qkvz and in_proj_ba, grouped per key head (regrouped at load)
};

struct Architecture {
  std::string model_type;
  QkNorm qk_norm = QkNorm::kNone;
  // Whether q/k/v carry biases when config.json does not say (qwen2_moe: qkv_bias, default true).
  bool default_qkv_bias = false;
  std::string qkv_bias_field = "attention_bias";
  // Tensor names below "model.layers.{i}."
  std::string moe_block = "mlp";           // "block_sparse_moe" for mixtral
  std::string expert_gate = "gate_proj";   // w1
  std::string expert_up = "up_proj";       // w3
  std::string expert_down = "down_proj";   // w2
  // Config field names that differ between families, tried in order.
  std::vector<std::string> num_experts_fields = {"num_experts", "num_local_experts"};
  std::vector<std::string> expert_width_fields = {"moe_intermediate_size"};
  bool has_shared_expert = false;      // qwen2_moe: shared_expert + sigmoid(shared_expert_gate)
  bool always_renormalize = false;     // mixtral: top-k weights always sum to 1
  bool default_norm_topk_prob = false;
  bool reads_sparse_step = false;      // decoder_sparse_step / mlp_only_layers are meaningful
  SlidingWindowRule sliding_window = SlidingWindowRule::kAllLayers;
  // Hybrids: layer_types entries "linear_attention" and "full_attention" (derived, when absent,
  // from full_attention_interval: full where (layer + 1) % interval == 0).
  LinearAttention linear_attention = LinearAttention::kNone;
  // Every RMSNorm but GatedDeltaNet's gated one scales by (1 + w) (the stored w is near 0).
  bool zero_centred_norms = false;
  // Full attention's q_proj interleaves per head hd query rows and hd gate rows; the attention
  // output is multiplied by sigmoid(gate) before o_proj.
  bool attention_output_gate = false;
  // partial_rotary_factor when config.json gives none.
  double default_partial_rotary_factor = 1.0;
  // The text model's fields live in config.json's "text_config" (vision-language checkpoints).
  bool text_config = false;

  // LFM2 (architectures.md §3): layer_types entries "conv" (a gated short convolution, no KV) and
  // "full_attention", required in config.json; the first num_dense_layers layers are dense.
  bool short_conv = false;
  // Routing by sigmoid: experts chosen by sigmoid(logit) + the layer's expert_bias, weighted by
  // the unbiased sigmoid, w / (sum w + 1e-6) when norm_topk_prob, times routed_scaling_factor.
  bool sigmoid_routing = false;
  // Defaults and field names of config.json that differ between families.
  bool default_tie_word_embeddings = false;
  double default_rope_theta = 10000.0;
  std::string rms_norm_eps_field = "rms_norm_eps";
  bool reads_head_dim = true;  // false: head_dim is always hidden_size / num_attention_heads
  // Tensor names below "model." / "model.layers.{i}.".
  std::string input_norm = "input_layernorm";
  std::string post_attention_norm = "post_attention_layernorm";
  std::string final_norm = "norm";
  std::string o_proj = "o_proj";
  std::string q_norm = "q_norm", k_norm = "k_norm";
  // Dense MLP layers: "{dense_block}.{gate,up,down}.weight".
  std::string dense_block = "mlp";
  std::string dense_gate = "gate_proj", dense_up = "up_proj", dense_down = "down_proj";
};

// Unimplemented names the model_type and lists those supported.
absl::StatusOr<Architecture> FindArchitecture(const std::string& model_type);
std::vector<std::string> SupportedArchitectures();

}  // namespace moe::engine
