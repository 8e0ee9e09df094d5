// RoPE (rotate-half layout) on the CPU.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::Rope(const RopeArgs& a) {
  MOE_CHECK(a.rotary_dim % 2 == 0 && a.rotary_dim <= a.head_dim)
      << "Rope: rotary_dim " << a.rotary_dim << " head_dim " << a.head_dim;
  const int half = a.rotary_dim / 2;
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const float pos = static_cast<float>(a.positions[t]);
    for (int h = 0; h < a.num_heads; ++h) {
      float* v = a.x + (t * a.num_heads + h) * a.head_dim;
      for (int i = 0; i < half; ++i) {
        // transformers computes the angle in fp32 as position * inv_freq
        const float angle = pos * a.inv_freq[i];
        const float c = std::cos(angle) * a.attention_factor;
        const float s = std::sin(angle) * a.attention_factor;
        const float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
      }
    }
  }
}

}  // namespace moe::kernels
