// RmsNorm on the GPU: one block per row, fp32 sum of squares reduced across the block.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kNormThreads = 256, kMaxNormThreads = 1024;

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight      (transformers' RMSNorm, eps inside)
template <typename W>
__global__ __launch_bounds__(kMaxNormThreads) void RmsNormKernel(float* out, const float* x,
                                                              int64_t H, const W* weight,
                                                              float eps) {
  const float* xr = x + blockIdx.x * H;  // [H]
  float* outr = out + blockIdx.x * H;    // [H]
  float sum = 0.f;
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) sum = fmaf(xr[h], xr[h], sum);
  sum = BlockSum(sum);
  // Same expression as the CPU reference: IEEE sqrt and division (no fast-math).
  const float inv = 1.f / sqrtf(sum / static_cast<float>(H) + eps);
  for (int64_t h = threadIdx.x; h < H; h += blockDim.x) outr[h] = xr[h] * inv * ToF32(weight[h]);
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::RmsNorm(float* out, const float* x, int64_t rows, const TensorView& weight,
                          float eps) {
  const int64_t H = weight.numel();
  MOE_CHECK(H > 0 && rows >= 0 && rows <= 0x7fffffff) << "RmsNorm: rows " << rows << " H " << H;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows));
  // Few rows (decode): a wide block, so that the row's loads are in flight at once (256 threads
  // on one row of 2048 took 8 us, H200); many rows: 256 threads per row.
  const int threads = rows >= num_sms_
                          ? cuda::kNormThreads
                          : static_cast<int>(std::clamp<int64_t>((H / 2 + 31) / 32 * 32, 64,
                                                                 cuda::kMaxNormThreads));
  switch (weight.dtype) {
    case DType::kF32:
      cuda::RmsNormKernel<<<grid, threads, 0, stream_>>>(
          out, x, H, static_cast<const float*>(weight.data), eps);
      break;
    case DType::kBF16:
      cuda::RmsNormKernel<<<grid, threads, 0, stream_>>>(
          out, x, H, static_cast<const __nv_bfloat16*>(weight.data), eps);
      break;
    case DType::kF16:
      cuda::RmsNormKernel<<<grid, threads, 0, stream_>>>(
          out, x, H, static_cast<const __half*>(weight.data), eps);
      break;
    default: MOE_CHECK(false) << "RmsNorm: unsupported weight dtype " << DTypeName(weight.dtype);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::kernels
