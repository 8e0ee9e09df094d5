// RoPE (rotate-half layout) on the GPU: one thread per rotated pair.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

// For pair i < rot/2 of head h of token t, angle = positions[t] * inv_freq[i]:
//   (x0, x1) = (x[i], x[i + rot/2]) -> (x0 c - x1 s, x1 c + x0 s), c, s scaled by attention_factor
__global__ void RopeKernel(float* x, const int32_t* positions, const float* inv_freq,
                           int64_t num_pairs, int num_heads, int head_dim, int half,
                           float attention_factor) {
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= num_pairs) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // t * num_heads + h
  const int64_t t = th / num_heads;
  float* v = x + th * head_dim;  // [D]
  // fp32 angle as transformers computes it; full-precision sincosf (no fast-math intrinsics).
  const float angle = static_cast<float>(positions[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  c *= attention_factor;
  s *= attention_factor;
  const float x0 = v[i], x1 = v[i + half];
  v[i] = x0 * c - x1 * s;
  v[i + half] = x1 * c + x0 * s;
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Rope(const RopeArgs& a) {
  MOE_CHECK(a.rotary_dim % 2 == 0 && a.rotary_dim <= a.head_dim && a.num_heads > 0)
      << "Rope: rotary_dim " << a.rotary_dim << " head_dim " << a.head_dim << " heads "
      << a.num_heads;
  const int half = a.rotary_dim / 2;
  if (a.num_tokens == 0 || half == 0) return;
  const int64_t pairs = a.num_tokens * a.num_heads * half;
  const int threads = 256;
  cuda::RopeKernel<<<static_cast<unsigned>(cuda::CeilDiv(pairs, threads)), threads, 0, stream_>>>(
      a.x, a.positions, a.inv_freq, pairs, a.num_heads, a.head_dim, half, a.attention_factor);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::kernels
