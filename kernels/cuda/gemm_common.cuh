// Device helpers shared by the dense (matmul.cu) and quantized (matmul_quant.cu) grouped GEMMs.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {

__device__ __forceinline__ GemmGroup GroupOf(const GemmParams& p, const GemmGroup& single,
                                             int g) {
  if (p.routed_ids != nullptr) {
    const void* w = p.routed_w[p.routed_ids[g]];
    return {w, g, w != nullptr ? 1 : 0};
  }
  return p.groups != nullptr ? p.groups[g] : single;
}

// U_g of the SwiGLU form.
__device__ __forceinline__ const void* UpOf(const GemmParams& p, int g) {
  return p.routed_ids != nullptr ? p.routed_up[p.routed_ids[g]] : p.up_groups[g].w;
}

// (x, y) as bf16 pairs, x in the low halves: hi + lo = (x, y) to 2^-16; sum += what they hold.
// How the tensor-core kernels take fp32 activations.
__device__ __forceinline__ void SplitBf16x2(float x, float y, uint32_t& hi, uint32_t& lo,
                                            float& sum) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  const float2 lf = __bfloat1622float2(l);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
  sum += (hf.x + lf.x) + (hf.y + lf.y);
}

// 4 bytes at any alignment, little-endian (matrices at odd addresses).
__device__ __forceinline__ uint32_t LoadU32Bytes(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
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

// The tiled GEMM both paths share: a 64x64 output tile per block of 256 threads, K staged 16 at a
// time into shared memory (A and W transposed, +4 padding), each thread owning a 4x4 sub-tile.
constexpr int kBM = 64, kBN = 64, kBK = 16, kTileThreads = 256;
using ATile = float[kBK][kBM + 4];  // (BK, BM)
using WTile = float[kBK][kBN + 4];  // (BK, BN)

// acc[i][j] += sum_kk A[kk][ty*4 + i] * W[kk][tx*4 + j] over the staged K slice.
__device__ __forceinline__ void TileFma(const ATile& As, const WTile& Ws, int tx, int ty,
                                        float (&acc)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < kBK; ++kk) {
    const float4 a4 = *reinterpret_cast<const float4*>(&As[kk][ty * 4]);
    const float4 b4 = *reinterpret_cast<const float4*>(&Ws[kk][tx * 4]);
    const float av[4] = {a4.x, a4.y, a4.z, a4.w}, bv[4] = {b4.x, b4.y, b4.z, b4.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// Writes the thread's 4x4 sub-tile of the block's tile at (m0, n0) of group g, in bounds only.
__device__ __forceinline__ void StoreTile(const GemmParams& p, const GemmGroup& g, int64_t m0,
                                          int64_t n0, int tx, int ty, const float (&acc)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t mi = m0 + ty * 4 + i;
    if (mi >= g.row_count) break;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t nj = n0 + tx * 4 + j;
      if (nj < p.N) StoreC(p, g.row_begin + mi, nj, acc[i][j]);
    }
  }
}

// The tensor-core GEMM (gemm_mma.cu) for bf16 and quantized weights; false (nothing launched)
// where it does not apply (other dtypes, K not a multiple of 32, A rows not 16-byte aligned).
bool LaunchGemmMma(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);

// The quantized path of LaunchGroupedGemm (matmul_quant.cu): p.w_dtype is kQ8, kQ4 or kQ2.
void DispatchQuant(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);

}  // namespace moe::kernels::cuda
