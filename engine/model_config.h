// ModelConfig: config.json and generation_config.json of a Hugging Face model directory. Fields
// keep their Hugging Face names; per-architecture differences are data (architecture.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/architecture.h"

namespace moe::engine {

// RoPE parameters as transformers 5 reads them: rope_parameters.X, else top-level X, else
// rope_scaling.X ("type" is an alias of "rope_type").
struct RopeConfig {
  std::string rope_type = "default";  // default | linear | yarn | llama3
  double rope_theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  int64_t original_max_position_embeddings = 0;  // 0: max_position_embeddings
  // yarn
  double attention_factor = 0.0;  // 0: derived from factor (and mscale/mscale_all_dim)
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 0.0, mscale_all_dim = 0.0;
  bool truncate = true;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
};

struct ModelConfig {
  Architecture arch;  // from model_type
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;           // Default: hidden_size / num_attention_heads
  int64_t intermediate_size = 0;  // dense MLP width (layers without experts)
  int64_t moe_intermediate_size = 0;  // expert width
  int64_t shared_expert_intermediate_size = 0;
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases
  double clip_qkv = 0.0;        // 0: no clipping (olmoe)
  // Sliding-window attention: sliding_window tokens on the layers whose layer_types entry is
  // "sliding_attention" (resolved from use_sliding_window, layer_types and max_window_layers by
  // the family's SlidingWindowRule; one entry per layer, "full_attention" or
  // "sliding_attention"). Read it through SlidingWindow(layer).
  int64_t sliding_window = 0;  // 0: full attention everywhere
  std::vector<std::string> layer_types;  // hybrids: "linear_attention" or "full_attention"
  // GatedDeltaNet (hybrids; architectures.md §1.5.3): NK key heads of DK, NV value heads of DV,
  // a depthwise causal conv of width KW over the 2 NK DK + NV DV channels of q, k and v.
  int64_t linear_num_key_heads = 0;
  int64_t linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0;
  int64_t linear_value_head_dim = 0;
  int64_t linear_conv_kernel_dim = 0;
  // LFM2's short convolution ("conv" layers): a depthwise causal conv of width conv_L_cache over
  // the H channels of B * X, with biases on in_proj, the conv and out_proj when conv_bias.
  int64_t conv_L_cache = 0;
  bool conv_bias = false;
  // The first num_dense_layers layers are dense (LFM2). Default: 0.
  int64_t num_dense_layers = 0;
  // Sigmoid routing (Architecture::sigmoid_routing): the routers' per-expert selection bias
  // (feed_forward.expert_bias) and the factor on the routed weights. Defaults: true, 1.0.
  bool use_expert_bias = true;
  double routed_scaling_factor = 1.0;
  // The activation of every MLP and expert: "silu" (transformers' "swish" is the same function);
  // anything else is refused at load.
  std::string hidden_act = "silu";
  RopeConfig rope;

  // generation_config.json (falls back to config.json's values)
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;

  // True when `layer` routes to experts (transformers: not in mlp_only_layers and
  // num_experts > 0 and (layer + 1) % decoder_sparse_step == 0).
  bool IsSparseLayer(int64_t layer) const;
  // The attention window of `layer` in tokens; 0: full attention.
  int64_t SlidingWindow(int64_t layer) const;
  // True when `layer` is GatedDeltaNet linear attention (no KV; a recurrent state instead).
  bool IsLinearLayer(int64_t layer) const;
  // True when `layer` is LFM2's short convolution (no KV; its conv state instead).
  bool IsConvLayer(int64_t layer) const;
  // Layers that keep keys and values (all but the linear and conv ones), and `layer`'s index
  // among them (-1 for the others): the paged cache and SequenceKv hold only those.
  int64_t NumKvLayers() const;
  int64_t KvLayerIndex(int64_t layer) const;
  // Floats of one sequence's state in `layer`: LinearStateFloats() for a linear layer, the short
  // conv's last conv_L_cache - 1 inputs [H, conv_L_cache - 1] for a conv layer, else 0. A
  // sequence's state is these, layer after layer; `layer`'s slice starts at StateOffset(layer).
  int64_t StateFloats(int64_t layer) const;
  int64_t StateOffset(int64_t layer) const;
  // 2 NK DK + NV DV: the channels of the linear layers' conv (q | k | v).
  int64_t LinearConvChannels() const;
  // Floats of one sequence's state in one linear layer: the conv's last KW-1 inputs [C, KW-1],
  // then the recurrent state [NV, DK, DV]. 0 for a model without linear layers.
  int64_t LinearStateFloats() const;
};

// Reads dir/config.json and, if present, dir/generation_config.json.
// NotFound: no config.json. InvalidArgument: malformed JSON, a missing or inconsistent field
// (named). Unimplemented: a model_type, rope type, hidden_act or layer type this engine does not
// run (named with its value).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);
// The same from JSON text (generation_config may be empty).
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& config_json,
                                             const std::string& generation_config_json);

}  // namespace moe::engine
