// Launchers shared between op files: the grouped GEMM (matmul.cu) that MatMul and ExpertFfn use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/tensor.h"

namespace moe::kernels::cuda {

// Groups of at most this many rows take the matrix-vector kernels (8 rows of A per pass over the
// weights, later passes mostly from L2); more take the tiled SIMT kernel. (At 8 the decode
// batches of 16-128 sequences fell to the tiled kernels: 1.4 ms per expert projection at 128
// tokens, 283 ms per 64-sequence step, H200, tests/bench/NOTES.md.)
constexpr int64_t kMatVecMaxRows = 64;

// One group of a grouped GEMM: rows [row_begin, row_begin + row_count) of the logical A and C
// use weight `w` ([N, K] row-major, the call's dtype). Lives in device memory.

struct GemmGroup {
  const void* w = nullptr;
  int64_t row_begin = 0;
  int64_t row_count = 0;
};

// For every group g and row m < row_count(g), with r = row_begin(g) + m and every n < N:
//   v = sum_k A[ra, k] * W_g[n, k]           ra = a_rows ? a_rows[r] : r
//   C[rc, n] (+)= (c_scale ? c_scale[r] : 1) * v      rc = c_rows ? c_rows[r] : r
// "+=" (atomicAdd, so rows may repeat) when accumulate, else "=". fp32 accumulation always.
struct GemmParams {
  const GemmGroup* groups = nullptr;  // [num_groups], device memory
  int num_groups = 0;
  int64_t max_rows = 0;               // max row_count over the groups (host knows it)
  DType w_dtype = DType::kF32;
  int64_t N = 0;
  int64_t K = 0;
  const float* a = nullptr;           // [*, lda]
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;
  float* c = nullptr;                 // [*, ldc]
  int64_t ldc = 0;
  const int32_t* c_rows = nullptr;
  const float* c_scale = nullptr;
  bool accumulate = false;
  // When set (matrix-vector sizes only: max_rows <= kMatVecMaxRows), the call computes the SwiGLU
  // product instead: C[rc, n] = F.silu(A W_g^T)[n] * (A U_g^T)[n], U_g = up_groups[g].w.
  const GemmGroup* up_groups = nullptr;
  // Routed groups in place of `groups` / `up_groups` (ExpertFfnRouted: read straight from Route's
  // output, no planning kernel): group g is {routed_w[routed_ids[g]], g, 1}, no rows when that
  // pointer is null; U_g = routed_up[routed_ids[g]].
  const int32_t* routed_ids = nullptr;
  const void* const* routed_w = nullptr;
  const void* const* routed_up = nullptr;
  // A routed id outside [0, routed_experts) gives its group no rows and puts routing_code into
  // *routing_verdict (the lowest kept: Backend::TakeRoutingError).
  int routed_experts = 0;
  unsigned int* routing_verdict = nullptr;
  unsigned int routing_code = 0;

  // One matrix (no groups table): the tensor-core GEMM splits K over k_splits blocks a tile, each
  // adding its share into C (so C must be zeroed and `accumulate` set; the other kernels ignore it
  // and accumulate whole sums). For decode batches whose tiles leave SMs idle.
  int k_splits = 1;
  // One matrix (no groups table) in groups of row_chunk rows of A: group g is rows [g row_chunk,
  // (g + 1) row_chunk) of the single group, so that a matrix-vector kernel takes more rows of A
  // than it holds at once (the weights read once a group: small matrices only, MatMul).
  int64_t row_chunk = 0;

  bool glu() const { return up_groups != nullptr || routed_up != nullptr; }
  bool has_groups() const { return groups != nullptr || routed_ids != nullptr; }
  int num_sms = 132;  // of the device: sizes the matrix-vector grid
  // Quantized w_dtype (kQ8/kQ4/kQ2, kernels/quant.h) only: every group's w points at the start of
  // one [N, K] quantized matrix (codes, then fp16 {scale, offset} pairs at QuantParamsOffset).
  int32_t group_size = 0;
  // A split once for the call by LaunchSplitForGemm over a_split_rows rows of A (where
  // PipelinedGemmTakes): the tensor-core GEMM then streams it through shared memory instead of
  // converting it in every block (gemm_mma.cu).
  const uint16_t* a_split = nullptr;
  int64_t a_split_rows = 0;
};

// Picks the matrix-vector kernel when max_rows <= kMatVecMaxRows (decode: weight bytes dominate)
// and the tiled kernel otherwise.
void LaunchGroupedGemm(const GemmParams& p, cudaStream_t stream);

// The tensor-core GEMM on A split once a call (gemm_mma.cu): for weights of w_dtype (bf16, or
// int4 in groups of a multiple of 64) and K a multiple of 64, LaunchSplitForGemm writes A
// (rows x K fp32, row stride lda) into `out` (SplitForGemmBytes(rows, K) bytes) as bf16 hi and lo
// parts in the order the kernel takes them, and fp32 sums of hi + lo per 64 columns; a GEMM with
// p.a_split set to it then runs that kernel past the matrix-vector sizes.
bool PipelinedGemmTakes(DType w_dtype, int64_t K, int32_t group_size);
size_t SplitForGemmBytes(int64_t rows, int64_t K);
void LaunchSplitForGemm(const float* a, int64_t rows, int64_t lda, int64_t K, DType w_dtype,
                        void* out, cudaStream_t stream);

}  // namespace moe::kernels::cuda

namespace moe::kernels::cuda {

// act[r, i] = F.silu(gate_up[r, i]) * gate_up[r, I + i]     gate_up: [rows, 2I]; act: [rows, I]
void LaunchSiluMul(float* act, const float* gate_up, int64_t rows, int64_t I, int num_sms,
                   cudaStream_t stream);

}  // namespace moe::kernels::cuda
