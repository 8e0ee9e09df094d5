// Device helpers shared by the dense (matmul.cu) and quantized (matmul_quant.cu) grouped GEMMs.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {

__device__ __forceinline__ GemmGroup GroupOf(const GemmParams& p, const GemmGroup& single,
                                             int g) {
  return p.groups != nullptr ? p.groups[g] : single;
}

// C[rc, n] (+)= scale * v for logical row r (see GemmParams).
__device__ __forceinline__ void StoreC(const GemmParams& p, int64_t r, int64_t n, float v) {
  const int64_t rc = p.c_rows != nullptr ? p.c_rows[r] : r;
  if (p.c_scale != nullptr) v *= p.c_scale[r];
  float* dst = p.c + rc * p.ldc + n;
  if (p.accumulate) {
    atomicAdd(dst, v);
  } else {
    *dst = v;
  }
}

// The quantized path of LaunchGroupedGemm (matmul_quant.cu): p.w_dtype is kQ8, kQ4 or kQ2.
void DispatchQuant(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);

}  // namespace moe::kernels::cuda
