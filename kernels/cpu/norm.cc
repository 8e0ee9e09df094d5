// RmsNorm on the CPU: one row at a time, fp32 accumulation.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
                         float eps) {
  const int64_t H = weight.numel();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * H;
    float sum = 0.f;
    for (int64_t h = 0; h < H; ++h) sum += xr[h] * xr[h];
    // transformers: x * rsqrt(mean(x^2) + eps), then * weight
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(H) + eps);
    for (int64_t h = 0; h < H; ++h) out[r * H + h] = xr[h] * inv * weight.at(h);
  }
}

}  // namespace moe::kernels
