// RmsNorm on the GPU, alone or after the residual add: one block per row, fp32 sum of squares
// reduced across the block.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kNormThreads = 256, kMaxNormThreads = 1024;

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight      (transformers' RMSNorm, eps inside)
// kAdd: x[r] += residual[r] first (written back; x is only written then). Each thread reads and
// writes the same elements in both passes, so out may alias residual.
template <typename W, bool kAdd>
__global__ __launch_bounds__(kMaxNormThreads) void RmsNormKernel(float* out, float* x,
                                                              const float* residual, int64_t H,
                                                              const W* weight, float eps) {
  WaitForPriorKernel();
  float* xr = x + blockIdx.x * H;      // [H]
  float* outr = out + blockIdx.x * H;  // [H]
  float sum = 0.f;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) {
    float v = xr[h];
    if constexpr (kAdd) {
      v += residual[blockIdx.x * H + h];
      xr[h] = v;
    }
    sum = fmaf(v, v, sum);
  }
  sum = BlockSum(sum);
  // Same expression as the CPU reference: IEEE sqrt and division (no fast-math).
  const float inv = 1.f / sqrtf(sum / static_cast<float>(H) + eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) outr[h] = xr[h] * inv * ToF32(weight[h]);
}

template <bool kAdd>
void LaunchRmsNorm(float* out, float* x, const float* residual, int64_t rows,
                   const TensorView& weight, float eps, int num_sms, cudaStream_t stream) {
  const int64_t H = weight.numel();
  MOE_CHECK(H > 0 && rows >= 0 && rows <= 0x7fffffff) << "RmsNorm: rows " << rows << " H " << H;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows));
  // Few rows (decode): a wide block, so that the row's loads are in flight at once (256 threads
  // on one row of 2048 took 8 us, H200); many rows: 256 threads per row.
  const int threads =
      rows >= num_sms
          ? kNormThreads
          : static_cast<int>(std::clamp<int64_t>((H / 2 + 31) / 32 * 32, 64, kMaxNormThreads));
  switch (weight.dtype) {
    case DType::kF32:
      Launch(RmsNormKernel<float, kAdd>, grid, threads, 0, stream,
             out, x, residual, H, static_cast<const float*>(weight.data), eps);
      break;
    case DType::kBF16:
      Launch(RmsNormKernel<__nv_bfloat16, kAdd>, grid, threads, 0, stream,
             out, x, residual, H, static_cast<const __nv_bfloat16*>(weight.data), eps);
      break;
    case DType::kF16:
      Launch(RmsNormKernel<__half, kAdd>, grid, threads, 0, stream,
             out, x, residual, H, static_cast<const __half*>(weight.data), eps);
      break;
    default: MOE_CHECK(false) << "RmsNorm: unsupported weight dtype " << DTypeName(weight.dtype);
  }
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
                          float eps) {
  // kAdd false: x is only read.
  cuda::LaunchRmsNorm<false>(out, const_cast<float*>(x), nullptr, rows, weight, eps, num_sms_,
                             stream_);
}

void CudaBackend::AddRmsNorm(float* x, const float* residual, float* out, int64_t rows,
                             const TensorView& weight, float eps) {
  cuda::LaunchRmsNorm<true>(out, x, residual, rows, weight, eps, num_sms_, stream_);
}

}  // namespace moe::kernels
