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
};

// Unimplemented names the model_type and lists those supported.
absl::StatusOr<Architecture> FindArchitecture(const std::string& model_type);
std::vector<std::string> SupportedArchitectures();

}  // namespace moe::engine
