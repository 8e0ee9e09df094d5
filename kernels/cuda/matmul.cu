// MatMul on the GPU: a grouped matrix-vector kernel (decode, weight-bandwidth bound) and a tiled
// grouped GEMM (prefill), both fp32 accumulation over fp32/bf16/fp16 weights; bias added after.
// bf16 GEMMs go to the tensor cores where they can (gemm_mma.cu); quantized weights
// (kQ8/kQ4/kQ2/kF8) take the kernels of matmul_quant.cu.
//
// Legend: M rows of A (tokens) per group, N weight rows (outputs), K reduction length.
// Why not cuBLAS: libcublasLt.so is 541 MB, the bundle limit 64 MiB (kernels/cuda/README.md).
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {
namespace {

// ---- matrix-vector: `ws` warps per weight row n (each a 1/ws slice of K), up to TB rows of A ----
// Each lane streams 16-byte weight vectors (kUnroll in flight) and dots them with the TB rows of
// A, which stay in L1/L2 (they are re-read by every warp; weights are read once). Splitting K
// over ws warps gives small-N matrices enough blocks to reach every SM.
constexpr int kMvWarps = 8;
// 8 loads in flight a lane (4 before): batch-1 decode of the Qwen3-30B-A3B shape 273.8 -> 279.4
// tokens/s over three interleaved rounds, though alone the 2048 x 4096 o projection gains (35.6
// -> 37.0% of HBM) while the 4096 x 2048 and the lm head lose (40.7 -> 36.3%, 89.5 -> 83.4%):
// within a step the kernels overlap (PDL), which the isolated bench does not see (H200, NOTES.md).
constexpr int kUnroll = 8;

// acc[r][j] += w[r][0..V) . xr[j][k..k + V) for the NW weight vectors w[r] (floats) and TB rows.
template <int V, int TB, int NW>
__device__ __forceinline__ void DotVector(const float (&w)[NW][V], const float* const (&xr)[TB],
                                          int64_t k, float (&acc)[NW][TB]) {
#pragma unroll
  for (int j = 0; j < TB; ++j) {
    const float4* x4 = reinterpret_cast<const float4*>(xr[j] + k);
#pragma unroll
    for (int v = 0; v < V / 4; ++v) {
      const float4 xv = __ldg(x4 + v);
#pragma unroll
      for (int r = 0; r < NW; ++r) {
        acc[r][j] = fmaf(w[r][4 * v + 0], xv.x, acc[r][j]);
        acc[r][j] = fmaf(w[r][4 * v + 1], xv.y, acc[r][j]);
        acc[r][j] = fmaf(w[r][4 * v + 2], xv.z, acc[r][j]);
        acc[r][j] = fmaf(w[r][4 * v + 3], xv.w, acc[r][j]);
      }
    }
  }
}

// acc[r][j] += w[r][k] * xr[j][k] for the NW weight rows w[r], over the k of thread `t` of
// kThreads (vector chunks of kVec, or single elements when !vec); the caller reduces over the
// threads. The NW rows' loads are issued together (kUnroll in flight per lane in all), so the
// SwiGLU form does not wait for the gate row before loading the up row, and shares the x loads.
// kThreads is a compile-time constant on purpose: the version with a run-time stride (and no
// early exit) ran the 623 MB lm head at 76% of HBM bandwidth instead of 91% (H200, NOTES.md).
template <typename W, int TB, int kThreads, int NW>
__device__ __forceinline__ void RowDot(const W* const (&w)[NW], int64_t K,
                                       const float* const (&xr)[TB], bool vec, int t,
                                       float (&acc)[NW][TB]) {
  constexpr int V = Vec16<W>::kVec;
  constexpr int kU = kUnroll / NW;
  if (vec) {
    constexpr int64_t step = static_cast<int64_t>(kThreads) * V;
    for (int64_t k0 = static_cast<int64_t>(t) * V; k0 < K; k0 += step * kU) {
      float wv[kU][NW][V];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int r = 0; r < NW; ++r) {
          if (k0 + u * step < K) Vec16<W>::Load(w[r] + k0 + u * step, wv[u][r]);
        }
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t k = k0 + u * step;
        if (k >= K) break;
        DotVector(wv[u], xr, k, acc);
      }
    }
  } else {  // odd K or unaligned rows: scalar loads, still coalesced across the warp
    for (int64_t k = t; k < K; k += kThreads) {
#pragma unroll
      for (int r = 0; r < NW; ++r) {
        const float wk = ToF32(w[r][k]);
#pragma unroll
        for (int j = 0; j < TB; ++j) acc[r][j] = fmaf(wk, xr[j][k], acc[r][j]);
      }
    }
  }
}

// kGlu: C = F.silu(A Wg^T) * (A Wu^T), Wg from groups, Wu from up_groups (same rows).
// Block: kMvWarps / ws weight rows, each split over K into ws slices (ws in {1, 4}); grid
// (ceil(N * ws / kMvWarps), groups). For matrices of few rows (ws = 4) and for more than TB rows
// of A (ws = 1: the passes over TB rows each re-read the warp's row from L1); StreamMatVecKernel
// below takes the others.
template <typename W, int TB, bool kGlu, int ws>
__global__ __launch_bounds__(kMvWarps * kWarp) void GroupedMatVecKernel(const GemmParams p,
                                                                       const GemmGroup single) {
  WaitForPriorKernel();
  __shared__ float partial[kMvWarps][TB][2];  // per warp: gate (or plain) and up sums
  const GemmGroup g = GroupOf(p, single, blockIdx.y);
  if (g.row_count == 0) return;  // block-uniform
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int slice = warp % ws;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (kMvWarps / ws) + warp / ws;
  const bool active = n < p.N;  // with ws > 1 no early return: a row's warps meet at barriers
  if constexpr (ws == 1) {
    if (!active) return;
  }
  constexpr int V = Vec16<W>::kVec;
  const int64_t K = p.K;
  const W* w = static_cast<const W*>(g.w) + (active ? n : 0) * K;  // [K]
  const W* wu = kGlu ? static_cast<const W*>(UpOf(p, blockIdx.y)) + (active ? n : 0) * K
                     : nullptr;
  const bool vec = K % V == 0 && (reinterpret_cast<uintptr_t>(g.w) & 15) == 0 &&
                   (!kGlu || (reinterpret_cast<uintptr_t>(wu) & 15) == 0) &&
                   (reinterpret_cast<uintptr_t>(p.a) & 15) == 0 && p.lda % 4 == 0;

  for (int64_t m0 = 0; m0 < g.row_count; m0 += TB) {  // block-uniform trip count
    const int nt = static_cast<int>(Min64(TB, g.row_count - m0));
    const float* xr[TB];  // [TB][K]
    RowsOfA(p, g, m0, nt, xr);
    constexpr int NW = kGlu ? 2 : 1;  // gate and up rows, or the one weight row
    float acc[NW][TB];
#pragma unroll
    for (int r = 0; r < NW; ++r) {
#pragma unroll
      for (int j = 0; j < TB; ++j) acc[r][j] = 0.f;
    }
    if (active) {
      if constexpr (kGlu) {
        const W* const rows[2] = {w, wu};
        RowDot<W, TB, ws * kWarp, 2>(rows, K, xr, vec, slice * kWarp + lane, acc);
      } else {
        const W* const rows[1] = {w};
        RowDot<W, TB, ws * kWarp, 1>(rows, K, xr, vec, slice * kWarp + lane, acc);
      }
    }
#pragma unroll
    for (int r = 0; r < NW; ++r) {
#pragma unroll
      for (int j = 0; j < TB; ++j) acc[r][j] = WarpSum(acc[r][j]);
    }
    if constexpr (ws > 1) {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < NW; ++r) {
#pragma unroll
          for (int j = 0; j < TB; ++j) partial[warp][j][r] = acc[r][j];
        }
      }
      __syncthreads();
      if (slice == 0) {  // slices summed in a fixed order: deterministic
#pragma unroll
        for (int r = 0; r < NW; ++r) {
#pragma unroll
          for (int j = 0; j < TB; ++j) {
            for (int s2 = 1; s2 < ws; ++s2) acc[r][j] += partial[warp + s2][j][r];
          }
        }
      }
      __syncthreads();  // partial is reused by the next chunk of rows
    }
    if (active && slice == 0 && lane == 0) {
#pragma unroll
      for (int j = 0; j < TB; ++j) {
        float v = acc[0][j];
        if constexpr (kGlu) v = v / (1.f + expf(-v)) * acc[NW - 1][j];
        if (j < nt) StoreC(p, g.row_begin + m0 + j, n, v);
      }
    }
  }
}

// ---- streaming matrix-vector: one warp per weight row at a time, rows in a loop -----------------
// The grid is what the GPU holds at once (no second wave); warp w of the grid takes rows w, w +
// all warps, ... The weights go in rounds of kUnroll 16-byte vectors a lane (one row of K = 2048
// bf16 per round), raw in registers, and the next round's loads are issued before this round's
// products: each warp keeps a round in flight from its first row to its last, where a warp per
// row (GroupedMatVecKernel) loaded one round, waited, computed and left, and the blocks after
// it started from an empty pipe.
template <typename W, int TB, bool kGlu>
__global__ __launch_bounds__(kMvWarps * kWarp) void StreamMatVecKernel(const GemmParams p,
                                                                      const GemmGroup single) {
  WaitForPriorKernel();
  const GemmGroup g = GroupOf(p, single, blockIdx.y);
  if (g.row_count == 0) return;  // block-uniform
  constexpr int V = Vec16<W>::kVec;
  constexpr int NW = kGlu ? 2 : 1;  // gate and up rows, or the one weight row
  constexpr int kU = kUnroll / NW;  // vectors a lane loads of each row a round
  constexpr int kStep = kWarp * V;  // elements of a row one vector load of the warp covers
  const int lane = threadIdx.x % kWarp;
  const int64_t K = p.K, N = p.N;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kMvWarps + threadIdx.x / kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kMvWarps;
  const W* base[2] = {static_cast<const W*>(g.w),
                      kGlu ? static_cast<const W*>(UpOf(p, blockIdx.y)) : nullptr};
  const bool vec = K % V == 0 && (reinterpret_cast<uintptr_t>(base[0]) & 15) == 0 &&
                   (!kGlu || (reinterpret_cast<uintptr_t>(base[1]) & 15) == 0) &&
                   (reinterpret_cast<uintptr_t>(p.a) & 15) == 0 && p.lda % 4 == 0;
  const int64_t rounds_per_row = CeilDiv(K, static_cast<int64_t>(kStep) * kU);
  const int64_t my_rows = first < N ? CeilDiv(N - first, stride) : 0;
  const int64_t rounds = my_rows * rounds_per_row;

  for (int64_t m0 = 0; m0 < g.row_count; m0 += TB) {
    const int nt = static_cast<int>(Min64(TB, g.row_count - m0));
    const float* xr[TB];  // [TB][K]
    RowsOfA(p, g, m0, nt, xr);
    auto store = [&](int64_t n, float (&acc)[NW][TB]) {
#pragma unroll
      for (int m = 0; m < NW; ++m) {
#pragma unroll
        for (int j = 0; j < TB; ++j) acc[m][j] = WarpSum(acc[m][j]);
      }
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < TB; ++j) {
          float v = acc[0][j];
          if constexpr (kGlu) v = v / (1.f + expf(-v)) * acc[NW - 1][j];
          if (j < nt) StoreC(p, g.row_begin + m0 + j, n, v);
        }
      }
    };
    if (!vec) {  // odd K or unaligned rows: scalar loads, a row at a time
      for (int64_t n = first; n < N; n += stride) {
        float acc[NW][TB] = {};
        const W* rows[NW];
#pragma unroll
        for (int m = 0; m < NW; ++m) rows[m] = base[m] + n * K;
        RowDot<W, TB, kWarp, NW>(rows, K, xr, false, lane, acc);
        store(n, acc);
      }
      continue;
    }
    // Round i: row first + (i / rounds_per_row) * stride, elements from (i % rounds_per_row) *
    // kStep * kU; buffer b (a compile-time index: registers).
    uint4 buf[2][NW][kU];  // raw weights
    auto load = [&](auto buffer, int64_t i) {
      constexpr int b = decltype(buffer)::value;
      const int64_t n = first + (i / rounds_per_row) * stride;
      const int64_t k0 = (i % rounds_per_row) * kStep * kU + lane * V;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int m = 0; m < NW; ++m) {
          if (k0 + u * kStep < K) {
            buf[b][m][u] = __ldg(reinterpret_cast<const uint4*>(base[m] + n * K + k0 + u * kStep));
          }
        }
      }
    };
    float acc[NW][TB] = {};
    auto compute = [&](auto buffer, int64_t i) {
      constexpr int b = decltype(buffer)::value;
      const int64_t k0 = (i % rounds_per_row) * kStep * kU + lane * V;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t k = k0 + u * kStep;
        if (k >= K) break;
        float wv[NW][V];
#pragma unroll
        for (int m = 0; m < NW; ++m) {
          const W* e = reinterpret_cast<const W*>(&buf[b][m][u]);
#pragma unroll
          for (int v = 0; v < V; ++v) wv[m][v] = ToF32(e[v]);
        }
        DotVector(wv, xr, k, acc);
      }
      if (i % rounds_per_row == rounds_per_row - 1) {  // the row's last round
        store(first + (i / rounds_per_row) * stride, acc);
#pragma unroll
        for (int m = 0; m < NW; ++m) {
#pragma unroll
          for (int j = 0; j < TB; ++j) acc[m][j] = 0.f;
        }
      }
    };
    using First = std::integral_constant<int, 0>;
    using Second = std::integral_constant<int, 1>;
    if (rounds > 0) load(First{}, 0);
    for (int64_t i = 0; i < rounds; i += 2) {
      if (i + 1 < rounds) load(Second{}, i + 1);
      compute(First{}, i);
      if (i + 1 >= rounds) break;
      if (i + 2 < rounds) load(First{}, i + 2);
      compute(Second{}, i + 1);
    }
  }
}

// Blocks of StreamMatVecKernel<W, TB, kGlu> the GPU holds at once (asked once per instance).
template <typename W, int TB, bool kGlu>
int64_t StreamMatVecResidentBlocks(int num_sms) {
  static const int per_sm = [] {
    int n = 0;
    MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, StreamMatVecKernel<W, TB, kGlu>, kMvWarps * kWarp, 0));
    return n > 0 ? n : 1;
  }();
  return static_cast<int64_t>(per_sm) * num_sms;
}

// ---- tensor-core matrix-vector: bf16 weights, 2..8 rows of A ------------------------------------
// With several rows of A the SIMT kernels above load x for every weight vector and every row (8
// rows: 256 bytes of x from L1 per 16 bytes of weights); here the tensor cores take 16 weight
// rows x 8 rows of A per instruction (gemm_common.cuh: StageMmaX's x, MmaMatVecStore). Lane (g,
// t) loads 32 bytes of rows g and g + 8 at element 16t of each 64-element chunk, in memory order.
// k-step s pairs x positions i, i + 4 (b0) and i + 1, i + 5 (b1), i = 8 (s / 2) + 2 (s % 2), so
// the A operand pairs the same weights: a0 = (i, i + 4) of row g, a2 = (i + 1, i + 5), from the
// words holding (i, i + 1) and (i + 4, i + 5) by two byte permutes.
template <bool kGlu, typename Split, bool kAligned>
__device__ __forceinline__ void Bf16MmaMatVec(const GemmParams& p, const GemmGroup& grp,
                                              float* partial) {
  constexpr int NW = kGlu ? 2 : 1;  // gate and up matrices, or the one weight matrix
  constexpr int kU = kGlu ? 1 : 2;  // chunks a round; two rounds in flight (registers)
  extern __shared__ uint32_t xsmem[];
  const MmaWarp mw = MmaWarp::Make<Split>(p, grp, xsmem);
  const int64_t K = p.K;
  const __nv_bfloat16* rows[NW][2];
#pragma unroll
  for (int m = 0; m < NW; ++m) {
    const auto* base = static_cast<const __nv_bfloat16*>(m == 0 ? grp.w : UpOf(p, blockIdx.y));
    rows[m][0] = base + mw.ra * K + 16 * mw.t;
    rows[m][1] = base + mw.rb * K + 16 * mw.t;
  }
  const int c_end = mw.c_end;

  // A round: kU chunks' 32 bytes per matrix and row, loads issued together, into buffer b (a
  // compile-time index: registers); the next round's loads go out before this round's products.
  uint32_t w[2][kU][NW][2][8];
  auto load_round = [&](auto buffer, int c0) {
    constexpr int b = decltype(buffer)::value;
#pragma unroll
    for (int m = 0; m < NW; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int c = c0 + u;
          if (c >= c_end) continue;
          const __nv_bfloat16* q = rows[m][h] + c * kMmaChunk;
          uint32_t(&dst)[8] = w[b][u][m][h];
          if constexpr (kAligned) {
            const uint4 lo = __ldg(reinterpret_cast<const uint4*>(q));
            const uint4 hi = __ldg(reinterpret_cast<const uint4*>(q) + 1);
            dst[0] = lo.x, dst[1] = lo.y, dst[2] = lo.z, dst[3] = lo.w;
            dst[4] = hi.x, dst[5] = hi.y, dst[6] = hi.z, dst[7] = hi.w;
          } else {
            const auto* bytes = reinterpret_cast<const uint8_t*>(q);
#pragma unroll
            for (int i = 0; i < 8; ++i) dst[i] = LoadU32Bytes(bytes + 4 * i);
          }
        }
      }
    }
  };
  load_round(std::integral_constant<int, 0>{}, mw.c_begin);  // before x is staged
  StageMmaX(p, grp, mw);

  float acc[1][NW][4] = {};
  auto compute_round = [&](auto buffer, int c0) {
    constexpr int b = decltype(buffer)::value;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;
      uint32_t xw[16];
      mw.LoadX(c, xw);
#pragma unroll
      for (int m = 0; m < NW; ++m) {
        const uint32_t(&wa)[8] = w[b][u][m][0];
        const uint32_t(&wb)[8] = w[b][u][m][1];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int i = 4 * (s / 2) + (s % 2);  // word of positions (2i, 2i + 1); + 2: (2i + 4, ..)
          const uint32_t a0 = __byte_perm(wa[i], wa[i + 2], 0x5410);
          const uint32_t a2 = __byte_perm(wa[i], wa[i + 2], 0x7632);
          const uint32_t a1 = __byte_perm(wb[i], wb[i + 2], 0x5410);
          const uint32_t a3 = __byte_perm(wb[i], wb[i + 2], 0x7632);
          MmaBf16(acc[0][m], a0, a1, a2, a3, xw[4 * s], xw[4 * s + 1]);
          MmaBf16(acc[0][m], a0, a1, a2, a3, xw[4 * s + 2], xw[4 * s + 3]);
        }
      }
    }
  };
  MmaRounds<kU>(mw.c_begin, c_end, load_round, compute_round);
  MmaMatVecStore<kGlu, Split, 1>(p, grp, mw.n0, acc, partial);
}

// One block an SM up to this much x (8 rows of K = 4096: 141 KB), two up to kMmaMaxSmem.
constexpr size_t kBf16MmaMaxSmem = 200 * 1024;

struct Bf16Mma {
  static constexpr uintptr_t kAlign = 16;  // 16-byte weight loads
  static constexpr size_t kMaxSmem = kBf16MmaMaxSmem;
  static constexpr int kTiles = 1;
  static constexpr int kBits = 16;
  template <bool kGlu, typename Split, bool kAligned>
  __device__ __forceinline__ static void Body(const GemmParams& p, const GemmGroup& grp,
                                              float* partial) {
    Bf16MmaMatVec<kGlu, Split, kAligned>(p, grp, partial);
  }
};

// The tensor-core path: bf16, 2..8 rows of A, whole chunks, aligned rows of A, enough rows of W
// to give half the SMs a block (the k/v projections and the router, 32 blocks or fewer, stay on
// the SIMT split kernel: a block's fixed cost, staging x, is most of their time) or rows in
// chunks (MatMul's small matrices past 8 rows); false when it does not apply.
bool LaunchBf16MmaMatVec(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  const int64_t chunks = p.K / kMmaChunk;
  const size_t smem = MmaSmemBytes(p.max_rows, chunks);
  const int64_t tiles = CeilDiv(p.N, 16) * p.num_groups;
  if (p.max_rows < 2 || p.max_rows > kMmaTokens || p.K % kMmaChunk != 0 || smem > kBf16MmaMaxSmem ||
      (p.row_chunk == 0 && 2 * CeilDiv(tiles * 8, kMmaWarps) < p.num_sms) ||
      (reinterpret_cast<uintptr_t>(p.a) & 15) != 0 || p.lda % 4 != 0) {
    return false;
  }
  LaunchMmaMatVec<Bf16Mma>(p, single, smem, p.num_sms * (smem <= kMmaMaxSmem ? 2 : 1), stream);
  return true;
}

// Warps per row: 4 (each a quarter of K) only when one warp per row leaves SMs without a block
// (k/v projections, the router). Measured on an H200 (tests/bench/NOTES.md): splitting whenever
// there were under 16 blocks per SM made 2048x2048 to 8192x8192 and the expert FFN slower.
template <typename W, int TB, bool kGlu>
void LaunchMatVecRows(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  const dim3 block(kMvWarps * kWarp);
  const bool split = p.K >= 2048 && CeilDiv(p.N, kMvWarps) * p.num_groups < p.num_sms;
  if (split) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N * 4, kMvWarps)),
                    static_cast<unsigned>(p.num_groups));
    Launch(GroupedMatVecKernel<W, TB, kGlu, 4>, grid, block, 0, stream, p, single);
  } else if (p.max_rows > TB) {  // passes over TB rows of A: each warp re-reads its row from L1
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kMvWarps)),
                    static_cast<unsigned>(p.num_groups));
    Launch(GroupedMatVecKernel<W, TB, kGlu, 1>, grid, block, 0, stream, p, single);
  } else {
    // One wave: the groups share the resident blocks (at least one block a group).
    const int64_t per_group = std::max<int64_t>(
        1, StreamMatVecResidentBlocks<W, TB, kGlu>(static_cast<int>(p.num_sms)) / p.num_groups);
    const dim3 grid(static_cast<unsigned>(std::min(CeilDiv(p.N, kMvWarps), per_group)),
                    static_cast<unsigned>(p.num_groups));
    Launch(StreamMatVecKernel<W, TB, kGlu>, grid, block, 0, stream, p, single);
  }
}

template <typename W, bool kGlu>
void LaunchMatVec(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if constexpr (std::is_same_v<W, __nv_bfloat16>) {
    if (LaunchBf16MmaMatVec(p, single, stream)) return;
  }
  if (p.max_rows <= 1) {
    LaunchMatVecRows<W, 1, kGlu>(p, single, stream);
  } else if (p.max_rows <= 2) {
    LaunchMatVecRows<W, 2, kGlu>(p, single, stream);
  } else if (p.max_rows <= 4) {
    LaunchMatVecRows<W, 4, kGlu>(p, single, stream);
  } else {
    LaunchMatVecRows<W, 8, kGlu>(p, single, stream);
  }
}

// ---- tiled GEMM: 64x64 output tile per block, 4x4 per thread, K in steps of 16 -----------------
// SIMT fp32 FMA, far from tensor-core speed: for fp32 and fp16 weights and the shapes
// `GemmMmaKernel` (gemm_mma.cu) does not take.

template <typename W>
__global__ __launch_bounds__(kTileThreads) void GroupedGemmTiledKernel(const GemmParams p,
                                                                      const GemmGroup single) {
  WaitForPriorKernel();
  const GemmGroup g = GroupOf(p, single, blockIdx.z);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  if (m0 >= g.row_count) return;
  __shared__ __align__(16) ATile As;  // A tile transposed
  __shared__ __align__(16) WTile Ws;  // W tile transposed

  const int tid = threadIdx.x;
  const int lr = tid / 4, lk = (tid % 4) * 4;  // loader: row lr of the tile, k lk..lk+3
  const int64_t m = m0 + lr, n = n0 + lr;
  const float* arow = nullptr;
  if (m < g.row_count) {
    const int64_t r = g.row_begin + m;
    arow = p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda;
  }
  const W* wrow = n < p.N ? static_cast<const W*>(g.w) + n * p.K : nullptr;

  const int ty = tid / 16, tx = tid % 16;  // this thread's 4x4 outputs
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.K; k0 += kBK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t k = k0 + lk + i;
      As[lk + i][lr] = arow != nullptr && k < p.K ? arow[k] : 0.f;
      Ws[lk + i][lr] = wrow != nullptr && k < p.K ? ToF32(wrow[k]) : 0.f;
    }
    __syncthreads();
    TileFma(As, Ws, tx, ty, acc);
    __syncthreads();
  }
  StoreTile(p, g, m0, n0, tx, ty, acc);
}

// out[t, n] += bias[n]
template <typename W>
__global__ void AddBiasKernel(float* out, int64_t T, int64_t N, const W* bias) {
  WaitForPriorKernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < T * N;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] += ToF32(bias[i % N]);
  }
}

// bf16 matrices take the tensor-core GEMM past the tensor-core matrix-vector kernel's 8 rows of A:
// the GEMM reads each weight once for up to 64 rows (K split where its tiles leave SMs idle), the
// matrix-vector kernels once per 8. H200, decode tokens/s with the GEMM from 9 rows against from
// 33: 12 sequences 970 / 728, 16 1,140 / 875, 24 1,745 / 1,134, 32 2,147 / 1,253, 48 equal
// (tests/gpu_results/batched_stop40/r5_*; from 33 left 32 sequences slower a step than 64).
constexpr int64_t kBf16GemmAboveRows = kMmaTokens;

template <typename W>
void LaunchTyped(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if (p.glu()) {
    LaunchMatVec<W, true>(p, single, stream);
  } else if (std::is_same_v<W, __nv_bfloat16> && p.max_rows > kBf16GemmAboveRows &&
             p.a_split != nullptr) {
    LaunchPipelinedGemm(p, single, stream);
  } else if (std::is_same_v<W, __nv_bfloat16> && p.max_rows > kBf16GemmAboveRows &&
             LaunchGemmMma(p, single, stream)) {
    // (Measured before the GEMM's K split, stop 18, 32 rows were the better threshold:
    // tests/gpu_results/bf16_gemm_rows_stop18.txt.)
  } else if (p.max_rows <= kMatVecMaxRows) {
    LaunchMatVec<W, false>(p, single, stream);
  } else if (!LaunchGemmMma(p, single, stream)) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kBN)),
                    static_cast<unsigned>(CeilDiv(p.max_rows, kBM)),
                    static_cast<unsigned>(p.num_groups));
    Launch(GroupedGemmTiledKernel<W>, grid, kTileThreads, 0, stream, p, single);
  }
}

void Dispatch(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  MOE_CHECK(p.num_groups > 0 && p.num_groups <= 65535 && p.N > 0 && p.K > 0 &&
            p.max_rows <= 65535LL * kBM)
      << "GroupedGemm: groups " << p.num_groups << " N " << p.N << " K " << p.K << " rows "
      << p.max_rows;
  MOE_CHECK(!p.glu() || (p.has_groups() && p.max_rows <= kMatVecMaxRows))
      << "GroupedGemm: the SwiGLU form needs a groups table and at most " << kMatVecMaxRows
      << " rows per group, got " << p.max_rows;
  if (p.max_rows == 0) return;
  switch (p.w_dtype) {
    case DType::kF32: return LaunchTyped<float>(p, single, stream);
    case DType::kBF16: return LaunchTyped<__nv_bfloat16>(p, single, stream);
    case DType::kF16: return LaunchTyped<__half>(p, single, stream);
    case DType::kQ8:
    case DType::kQ4:
    case DType::kQ2:
    case DType::kF8: return DispatchQuant(p, single, stream);
    default: MOE_CHECK(false) << "GroupedGemm: unsupported weight dtype " << DTypeName(p.w_dtype);
  }
}

}  // namespace

void LaunchGroupedGemm(const GemmParams& p, cudaStream_t stream) {
  MOE_CHECK(p.has_groups()) << "GroupedGemm: no groups table and no routed groups";
  Dispatch(p, GemmGroup{}, stream);
}

}  // namespace moe::kernels::cuda

namespace moe::kernels {

// MatMul takes the pipelined GEMM from this many rows of A plus one. On wgmma: every GEMM (bf16
// ones start past 8 rows); H200 decode tokens/s, within one call each: 16 sequences 1,144 / 1,132
// against 1,131 / 1,119 from 49 rows, 32 2,199 / 2,157 against 2,153 / 2,130; 64 3,714 against
// 3,659 from 257, 256 7,529 against 7,039. On mma.sync: past decode batches only (its extra
// launch made 64 sequences 1.8% slower, stop 42). MOE_GEMM_SPLIT_ABOVE=N moves it (measurements).
int64_t SplitGemmAboveRows() {
  static const int64_t rows = [] {
    const char* env = std::getenv("MOE_GEMM_SPLIT_ABOVE");
    if (env != nullptr) return std::max(0L, std::strtol(env, nullptr, 10));
    return cuda::WgmmaGemm() ? int64_t{0} : int64_t{256};
  }();
  return rows;
}

void CudaBackend::MatMul(float* out, const float* x, int64_t T, const TensorView& w,
                         const TensorView* bias) {
  MOE_CHECK(w.rank == 2) << "MatMul: weight rank " << w.rank;
  const int64_t N = w.dim(0), K = w.dim(1);
  MOE_CHECK(bias == nullptr || bias->numel() == N)
      << "MatMul: bias " << bias->numel() << " vs N " << N;
  if (T == 0) return;
  cuda::GemmParams p;
  p.num_groups = 1;
  p.max_rows = T;
  p.w_dtype = w.dtype;
  p.N = N;
  p.K = K;
  p.a = x;
  p.lda = K;
  p.c = out;
  p.ldc = N;
  p.num_sms = num_sms_;
  p.group_size = w.group_size;
  if (w.dtype == DType::kBF16 && T > cuda::kMmaTokens && T <= cuda::kMatVecMaxRows &&
      N <= cuda::kGemmTileCols && K % cuda::kMmaChunk == 0) {
    // A matrix of one GEMM tile column (the router) past 8 rows: the tensor-core matrix-vector
    // kernel in chunks of 8 rows, the weights (at most 128 rows) read once a chunk, mostly from
    // L2. The GEMM took zero + split + a launch of one tile column over K slices: ~18 us at 64
    // rows, most of it fixed latency; this takes 6.7 (H200, tests/bench/NOTES.md, stop 47).
    p.row_chunk = cuda::kMmaTokens;
    p.max_rows = cuda::kMmaTokens;
    p.num_groups = static_cast<int>(cuda::CeilDiv(T, cuda::kMmaTokens));
    cuda::Dispatch(p, cuda::GemmGroup{w.data, 0, T}, stream_);
    AddBias(out, T, N, bias);
    return;
  }
  // Rows the tensor-core GEMM takes (bf16 past 8, quantized past kMatVecMaxRows) whose tiles
  // would not give every SM two blocks (decode batches: k/v projections and the router at 256
  // rows are 16 and 4 tiles): K split so that they do, each slice at least 8 k-tiles, into C
  // zeroed first. MOE_GEMM_SPLITK=0 turns it off (measurements).
  const bool gemm = w.dtype == DType::kBF16 ? T > cuda::kBf16GemmAboveRows
                                            : IsQuantized(w.dtype) && T > cuda::kMatVecMaxRows;
  if (gemm && split_k_) {
    const int64_t tiles = cuda::CeilDiv(N, cuda::kGemmTileCols) * cuda::CeilDiv(T, cuda::kGemmTileRows);
    p.k_splits = static_cast<int>(std::min(2 * num_sms_ / tiles, std::max<int64_t>(1, K / (32 * 8))));
    p.k_splits = std::max(p.k_splits, 1);
    if (p.k_splits > 1) {
      Zero(out, static_cast<size_t>(T * N) * sizeof(float));
      p.accumulate = true;
    }
  }
  // A split once a call for the pipelined GEMM past SplitGemmAboveRows() (above; with mma.sync a
  // 2,048-token prefill gained 12% by it, tests/bench/NOTES.md, stop 42). It splits K for bf16
  // only.
  if (gemm && split_gemm_ && T > SplitGemmAboveRows() &&
      cuda::PipelinedGemmTakes(w.dtype, K, w.group_size) &&
      (p.k_splits <= 1 || w.dtype == DType::kBF16)) {
    void* split = Reserve(gemm_split_, cuda::SplitForGemmBytes(T, K));
    cuda::LaunchSplitForGemm(x, T, K, K, w.dtype, split, stream_);
    p.a_split = static_cast<const uint16_t*>(split);
    p.a_split_rows = T;
  }
  // One group passed by value: no host->device copy on the decode path.
  cuda::Dispatch(p, cuda::GemmGroup{w.data, 0, T}, stream_);
  AddBias(out, T, N, bias);
}

void CudaBackend::AddBias(float* out, int64_t T, int64_t N, const TensorView* bias) {
  if (bias == nullptr) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(cuda::CeilDiv(T * N, threads),
                                                                  num_sms_ * 8));
  switch (bias->dtype) {
    case DType::kF32:
      cuda::Launch(cuda::AddBiasKernel<float>, blocks, threads, 0, stream_,
                   out, T, N, static_cast<const float*>(bias->data));
      break;
    case DType::kBF16:
      cuda::Launch(cuda::AddBiasKernel<__nv_bfloat16>, blocks, threads, 0, stream_,
                   out, T, N, static_cast<const __nv_bfloat16*>(bias->data));
      break;
    case DType::kF16:
      cuda::Launch(cuda::AddBiasKernel<__half>, blocks, threads, 0, stream_,
                   out, T, N, static_cast<const __half*>(bias->data));
      break;
    default: MOE_CHECK(false) << "MatMul: unsupported bias dtype " << DTypeName(bias->dtype);
  }
}

}  // namespace moe::kernels
