// RoPE (rotate-half layout) on the GPU: one thread per rotated pair.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

// Element pair (x0, x1) of one rotary frequency turned by position · inv_freq, scaled: the fp32
// angle as transformers computes it, full-precision sincosf (no fast-math intrinsics).
__device__ __forceinline__ void RotatePair(int32_t position, float inv_freq, float attention_factor,
                                           float x0, float x1, float& out0, float& out1) {
  const float angle = static_cast<float>(position) * inv_freq;
  float s, c;
  sincosf(angle, &s, &c);
  c *= attention_factor;
  s *= attention_factor;
  out0 = x0 * c - x1 * s;
  out1 = x1 * c + x0 * s;
}

// For pair i < rot/2 of head h of token t, angle = positions[t] * inv_freq[i]:
//   (x0, x1) = (x[i], x[i + rot/2]) -> (x0 c - x1 s, x1 c + x0 s), c, s scaled by attention_factor
__global__ void RopeKernel(float* x, const int32_t* positions, const float* inv_freq,
                           int64_t num_pairs, int num_heads, int head_dim, int half,
                           float attention_factor) {
  WaitForPriorKernel();
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= num_pairs) return;
  const int i = static_cast<int>(idx % half);
  const int64_t th = idx / half;  // t * num_heads + h
  const int64_t t = th / num_heads;
  float* v = x + th * head_dim;  // [D]
  RotatePair(positions[t], inv_freq[i], attention_factor, v[i], v[i + half], v[i], v[i + half]);
}

// One block per (token, head) row, one thread per element (blockDim a multiple of 32 >= D):
// y = x / sqrt(mean(x^2) + eps) * w in shared memory, then RopeKernel's rotation of y.
template <typename W>
__global__ void HeadNormRopeKernel(float* x, const W* weight, float eps, const int32_t* positions,
                                   const float* inv_freq, int num_heads, int head_dim, int half,
                                   float attention_factor) {
  WaitForPriorKernel();
  extern __shared__ float y[];  // [D]
  const int64_t row = blockIdx.x;  // t * num_heads + h
  const int d = threadIdx.x;
  float* v = x + row * head_dim;
  const float xd = d < head_dim ? v[d] : 0.f;
  const float sum = BlockSum(xd * xd);
  // The RmsNorm kernel's expression: IEEE sqrt and division.
  const float inv = 1.f / sqrtf(sum / static_cast<float>(head_dim) + eps);
  if (d < head_dim) y[d] = xd * inv * ToF32(weight[d]);
  __syncthreads();
  if (d < half) {
    RotatePair(positions[row / num_heads], inv_freq[d], attention_factor, y[d], y[d + half], v[d],
               v[d + half]);
  } else if (d >= 2 * half && d < head_dim) {
    v[d] = y[d];  // past rotary_dim: normalized, not rotated
  }
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
  cuda::Launch(cuda::RopeKernel, static_cast<unsigned>(cuda::CeilDiv(pairs, threads)), threads, 0,
               stream_, a.x, a.positions, a.inv_freq, pairs, a.num_heads, a.head_dim, half,
               a.attention_factor);
}

void CudaBackend::HeadNormRope(const RopeArgs& a, const TensorView& w, float eps) {
  MOE_CHECK(a.rotary_dim % 2 == 0 && a.rotary_dim <= a.head_dim && a.num_heads > 0 &&
            w.numel() == a.head_dim && a.head_dim <= 1024)
      << "HeadNormRope: rotary_dim " << a.rotary_dim << " head_dim " << a.head_dim << " weight "
      << w.numel();
  const int64_t rows = a.num_tokens * a.num_heads;
  if (rows == 0) return;
  MOE_CHECK(rows <= 0x7fffffff) << "HeadNormRope: " << rows << " rows";
  const int threads = (a.head_dim + 31) / 32 * 32;
  const size_t smem = static_cast<size_t>(a.head_dim) * sizeof(float);
  const int half = a.rotary_dim / 2;
  const dim3 grid(static_cast<unsigned>(rows));
  switch (w.dtype) {
    case DType::kF32:
      cuda::Launch(cuda::HeadNormRopeKernel<float>, grid, threads, smem, stream_,
                   a.x, static_cast<const float*>(w.data), eps, a.positions, a.inv_freq,
                   a.num_heads, a.head_dim, half, a.attention_factor);
      break;
    case DType::kBF16:
      cuda::Launch(cuda::HeadNormRopeKernel<__nv_bfloat16>, grid, threads, smem, stream_,
                   a.x, static_cast<const __nv_bfloat16*>(w.data), eps, a.positions, a.inv_freq,
                   a.num_heads, a.head_dim, half, a.attention_factor);
      break;
    case DType::kF16:
      cuda::Launch(cuda::HeadNormRopeKernel<__half>, grid, threads, smem, stream_,
                   a.x, static_cast<const __half*>(w.data), eps, a.positions, a.inv_freq,
                   a.num_heads, a.head_dim, half, a.attention_factor);
      break;
    default: MOE_CHECK(false) << "HeadNormRope: unsupported weight dtype " << DTypeName(w.dtype);
  }
}

}  // namespace moe::kernels
