// Causal GQA attention over a contiguous per-sequence KV cache on the CPU; parallel over heads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::Attention(const AttentionArgs& a) {
  MOE_CHECK(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0)
      << "Attention: heads " << a.num_heads << " kv heads " << a.num_kv_heads;
  const int group = a.num_heads / a.num_kv_heads;
  const int D = a.head_dim;
  const int64_t kv_stride = static_cast<int64_t>(a.num_kv_heads) * D;
  pool_.ParallelFor(a.num_tokens * a.num_heads, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t t = job / a.num_heads;
      const int h = static_cast<int>(job % a.num_heads);
      const int kvh = h / group;
      const int64_t pos = a.start_pos + t;
      const int64_t first = a.sliding_window > 0 ? std::max<int64_t>(0, pos - a.sliding_window + 1) : 0;
      const float* q = a.q + (t * a.num_heads + h) * D;
      scores.resize(pos - first + 1);
      float max_score = -INFINITY;
      for (int64_t s = first; s <= pos; ++s) {
        const float* k = a.k_cache + s * kv_stride + kvh * D;
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot += q[d] * k[d];
        scores[s - first] = dot * a.scale;
        max_score = std::max(max_score, scores[s - first]);
      }
      float denom = 0.f;
      for (float& sc : scores) {
        sc = std::exp(sc - max_score);
        denom += sc;
      }
      float* out = a.out + (t * a.num_heads + h) * D;
      std::fill(out, out + D, 0.f);
      for (int64_t s = first; s <= pos; ++s) {
        const float p = scores[s - first] / denom;
        const float* v = a.v_cache + s * kv_stride + kvh * D;
        for (int d = 0; d < D; ++d) out[d] += p * v[d];
      }
    }
  });
}

}  // namespace moe::kernels
