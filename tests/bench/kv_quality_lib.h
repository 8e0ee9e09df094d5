// KV-cache quality measurements of the TurboQuant spec (/work/shared/turboquant.md): T7 (attention
// output relative L2 error and attention-probability KL of a compressed cache against the bf16
// cache, on given Q/K/V) and T8 (next-token KL and greedy agreement of a model whose paged cache
// is in a format against the same model with a bf16 cache). Used by kv-quality and its test.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "kernels/kvcodec/kv_quant.h"

namespace moe::bench {

struct AttentionQuality {
  double rel_l2 = 0;   // mean over (query, head) of ||o - o_bf16|| / ||o_bf16||
  double kl = 0;       // mean over (query, head) of KL(p_bf16 || p)
  int64_t samples = 0;
};

// Causal attention of T queries over T keys/values (query t sees 0..t): q [T, NH, D],
// k, v [T, NKV, D], post-RoPE. Both caches are read through KvCodec (Score / AccumulateValues /
// FinishValues), as the engine does. InvalidArgument for a format the head_dim does not support.
absl::StatusOr<AttentionQuality> MeasureAttention(kernels::KvFormat format, const float* q,
                                                  const float* k, const float* v, int64_t T,
                                                  int num_heads, int num_kv_heads, int head_dim,
                                                  int layer);

// Q/K/V of every layer for one prefill of `tokens` through `model` (contiguous fp32 cache).
struct LayerQkv {
  std::vector<float> q, k, v;
  int64_t T = 0;
};
absl::StatusOr<std::vector<LayerQkv>> CaptureQkv(engine::Model& model,
                                                const std::vector<int32_t>& tokens);

struct NextTokenQuality {
  double mean_kl = 0;     // KL(p_bf16 || p_format) of the next-token distribution, mean
  double max_kl = 0;
  double agreement = 0;   // fraction of positions whose argmax equals the bf16 cache's
  int64_t positions = 0;
};
// Prefills `prompt`, then decodes `steps` tokens, teacher-forced on the bf16 cache's greedy
// tokens, with one paged cache in bf16 and one in `format` (with a 16-bit tail of `tail_tokens`
// when > 0: engine/paged_kv.h); compares every step's logits. Hybrid models get their states.
absl::StatusOr<NextTokenQuality> MeasureNextToken(engine::Model& model, kernels::KvFormat format,
                                                  const std::vector<int32_t>& prompt, int steps,
                                                  int tail_tokens = 0);

}  // namespace moe::bench
