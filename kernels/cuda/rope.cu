// RoPE (rotate-half layout) on the GPU: one thread per rotated pair.
#include <type_traits>
#include <utility>

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

// One warp per (token, head) row, blockDim / 32 rows a block, lane l holding elements l + 32 i,
// i < kPerLane (head_dim <= 32 kPerLane; every load of the row issued at once):
// y = x / sqrt(mean(x^2) + eps) * w into the warp's shared memory, then RopeKernel's rotation of
// y. Rows [0, a_rows) are tensor a's ([T, a_heads, D], weight wa), the rest tensor b's right
// after them in memory ([T, b_heads, D], weight wb): q and k in one launch. (A block a row with a
// block-wide sum took 13.7 us for the 9,216 rows of 256 tokens of the 30B shape; this, 4 rows a
// block, 5.9 us. H200, tests/bench/NOTES.md, stop 46.)
template <typename W, int kPerLane>
__global__ void HeadNormRopeKernel(float* x, int64_t a_rows, int64_t rows, int a_heads, const W* wa,
                                   int b_heads, const W* wb, float eps, const int32_t* positions,
                                   const float* inv_freq, int head_dim, int half,
                                   float attention_factor) {
  WaitForPriorKernel();
  extern __shared__ float smem[];  // [blockDim / 32][D]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / kWarp) + warp;
  if (row >= rows) return;  // warp-uniform; no block barrier below
  const bool in_a = row < a_rows;
  const int64_t token = in_a ? row / a_heads : (row - a_rows) / b_heads;
  const W* weight = in_a ? wa : wb;
  float* v = x + row * head_dim;
  float* y = smem + warp * head_dim;
  float xs[kPerLane], ws[kPerLane], freq[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    xs[i] = d < head_dim ? v[d] : 0.f;
    ws[i] = d < head_dim ? ToF32(weight[d]) : 0.f;
    freq[i] = d < half ? inv_freq[d] : 0.f;
  }
  const int32_t position = positions[token];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) sum += xs[i] * xs[i];
  sum = WarpSum(sum);
  // The RmsNorm kernel's expression: IEEE sqrt and division.
  const float inv = 1.f / sqrtf(sum / static_cast<float>(head_dim) + eps);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < head_dim) y[d] = xs[i] * inv * ws[i];
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + i * kWarp;
    if (d < half) {
      RotatePair(position, freq[i], attention_factor, y[d], y[d + half], v[d], v[d + half]);
    } else if (d >= 2 * half && d < head_dim) {
      v[d] = y[d];  // past rotary_dim: normalized, not rotated
    }
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

void CudaBackend::HeadNormRope(const RopeArgs& q, const TensorView& q_norm, const RopeArgs& k,
                               const TensorView& k_norm, float eps) {
  for (const auto& [a, w] : {std::pair{&q, &q_norm}, std::pair{&k, &k_norm}}) {
    MOE_CHECK(a->rotary_dim % 2 == 0 && a->rotary_dim <= a->head_dim && a->num_heads > 0 &&
              w->numel() == a->head_dim && a->head_dim <= 1024 &&
              a->num_tokens * a->num_heads <= 0x7fffffff)
        << "HeadNormRope: rotary_dim " << a->rotary_dim << " head_dim " << a->head_dim
        << " heads " << a->num_heads << " tokens " << a->num_tokens << " weight " << w->numel();
  }
  const int64_t q_rows = q.num_tokens * q.num_heads, k_rows = k.num_tokens * k.num_heads;
  // One launch when k's rows follow q's and everything but the weights is shared.
  const bool one = k.x == q.x + q_rows * q.head_dim && k.head_dim == q.head_dim &&
                   k.rotary_dim == q.rotary_dim && k.positions == q.positions &&
                   k.inv_freq == q.inv_freq && k.attention_factor == q.attention_factor &&
                   k_norm.dtype == q_norm.dtype && q_rows + k_rows <= 0x7fffffff;
  auto launch = [&](const RopeArgs& a, int64_t a_rows, const TensorView& wa, const RopeArgs& b,
                    int64_t b_rows, const TensorView& wb) {
    if (a_rows + b_rows == 0) return;
    // Rows a block: 4, or 1 where that would leave SMs without a row (decode of a few tokens).
    const int64_t rows = a_rows + b_rows;
    const int per_block = rows >= 4 * num_sms_ ? 4 : 1;
    const size_t smem = static_cast<size_t>(per_block * a.head_dim) * sizeof(float);
    const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(rows, int64_t{per_block})));
    auto go = [&](auto* tag) {
      using W = std::remove_pointer_t<decltype(tag)>;
      // 4 elements a lane up to head_dim 128, else 32 (head_dim <= 1024, checked above).
      auto kernel = a.head_dim <= 4 * cuda::kWarp ? cuda::HeadNormRopeKernel<W, 4>
                                                  : cuda::HeadNormRopeKernel<W, 32>;
      cuda::Launch(kernel, grid, per_block * cuda::kWarp, smem, stream_, a.x, a_rows, rows,
                   a.num_heads, static_cast<const W*>(wa.data), b.num_heads,
                   static_cast<const W*>(wb.data), eps, a.positions, a.inv_freq, a.head_dim,
                   a.rotary_dim / 2, a.attention_factor);
    };
    switch (wa.dtype) {
      case DType::kF32: return go(static_cast<float*>(nullptr));
      case DType::kBF16: return go(static_cast<__nv_bfloat16*>(nullptr));
      case DType::kF16: return go(static_cast<__half*>(nullptr));
      default: MOE_CHECK(false) << "HeadNormRope: unsupported weight dtype " << DTypeName(wa.dtype);
    }
  };
  if (one) {
    launch(q, q_rows, q_norm, k, k_rows, k_norm);
  } else {
    launch(q, q_rows, q_norm, q, 0, q_norm);
    launch(k, k_rows, k_norm, k, 0, k_norm);
  }
}

}  // namespace moe::kernels
