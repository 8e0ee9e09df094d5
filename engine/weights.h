// ModelWeights: the dense (non-expert) weights of every layer, resident on the backend, and the
// names of each expert's tensors (experts themselves are reached through an ExpertProvider).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "expertstore/importer.h"
#include "expertstore/safetensors.h"
#include "kernels/backend.h"

namespace moe::engine {

// GatedDeltaNet (linear-attention layers), Qwen3.5's layout (architectures.md §1.4).
struct LinearAttentionWeights {
  kernels::DeviceTensor in_qkv;    // [C, H], C = 2 NK DK + NV DV: q | k | v
  kernels::DeviceTensor in_z;      // [NV DV, H]
  kernels::DeviceTensor in_b;      // [NV, H]
  kernels::DeviceTensor in_a;      // [NV, H]
  kernels::DeviceTensor conv;      // [C, 1, KW]
  kernels::DeviceTensor a_log;     // [NV]
  kernels::DeviceTensor dt_bias;   // [NV]
  kernels::DeviceTensor norm;      // [DV], the gated norm (plain scale)
  kernels::DeviceTensor out_proj;  // [H, NV DV]
};

// LFM2's short conv (conv layers), architectures.md §3.2: in_proj [3H, H] is split at load into
// its B, C and X rows; the biases exist with conv_bias only (data null otherwise).
struct ShortConvWeights {
  kernels::DeviceTensor in_b, in_c, in_x;                 // [H, H] each
  kernels::DeviceTensor in_b_bias, in_c_bias, in_x_bias;  // [H] each
  kernels::DeviceTensor conv, conv_bias;                  // [H, 1, L], [H]
  kernels::DeviceTensor out_proj, out_bias;               // [H, H], [H]
};

struct LayerWeights {
  kernels::DeviceTensor input_layernorm;           // [H]
  kernels::DeviceTensor post_attention_layernorm;  // [H]
  kernels::DeviceTensor q_proj, k_proj, v_proj;    // [NH*D, H], [NKV*D, H], [NKV*D, H]
  kernels::DeviceTensor q_bias, k_bias, v_bias;    // present when config.attention_bias
  // q, k and v stacked, [NH*D + 2 NKV*D, H], when they share a dense dtype (their biases too, if
  // any) on a GPU backend: q_proj/k_proj/v_proj (and the biases) are then views of its rows and
  // own nothing. Empty otherwise (and always on the CPU backend, which reads the checkpoint in
  // place). Decoding one token takes it as one matrix-vector product.
  kernels::DeviceTensor qkv_proj, qkv_bias;
  kernels::DeviceTensor q_gate_proj;  // [NH*D, H]: the output gate's rows of a gated q_proj
  kernels::DeviceTensor o_proj;                    // [H, NH*D]
  kernels::DeviceTensor q_norm, k_norm;            // [D] per head, or [NH*D]/[NKV*D] whole
  bool sparse = false;
  kernels::DeviceTensor router;  // [E, H] (sparse layers)
  // Sigmoid routing with use_expert_bias: the selection bias [E], fp32 (RouteArgs).
  kernels::DeviceTensor expert_bias;
  // Dense MLP (non-sparse layers) or the shared expert (qwen2_moe), as one SwiGLU MLP.
  kernels::DeviceTensor mlp_gate, mlp_up, mlp_down;
  kernels::ExpertWeights mlp;   // views of the three above; mlp.gate.data == nullptr if absent
  kernels::DeviceTensor shared_expert_gate;  // [1, H]
  // Linear-attention layers (ModelConfig::IsLinearLayer) have these instead of attention's.
  LinearAttentionWeights linear;
  ShortConvWeights conv;  // conv layers (ModelConfig::IsConvLayer), likewise
};

// Tensor names of one expert in a Hugging Face checkpoint.
store::ExpertTensorNames ExpertNames(const ModelConfig& config, int64_t layer, int64_t expert);

struct ModelWeights {
  kernels::DeviceTensor embed_tokens;  // [V, H]
  kernels::DeviceTensor norm;          // [H]
  kernels::DeviceTensor lm_head;       // [V, H] (the embedding when tied)
  std::vector<LayerWeights> layers;
};

// Loads every dense weight from `checkpoint`, checking each shape against `config`. Zero-centred
// norm weights are stored as used, 1 + w in fp32.
// NotFound / InvalidArgument name the tensor (missing, mis-shaped).
absl::StatusOr<ModelWeights> LoadDenseWeights(const ModelConfig& config,
                                              const store::Checkpoint& checkpoint,
                                              kernels::Backend& backend);

// Views of every expert of every sparse layer, checked for shape, uploaded to the backend.
// `storage` keeps uploaded copies alive (empty on the CPU backend).
absl::StatusOr<std::vector<std::vector<kernels::ExpertWeights>>> LoadExpertsFromCheckpoint(
    const ModelConfig& config, const store::Checkpoint& checkpoint, kernels::Backend& backend,
    std::vector<kernels::DeviceTensor>* storage);

}  // namespace moe::engine
