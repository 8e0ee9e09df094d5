// Device helpers shared by the dense (matmul.cu) and quantized (matmul_quant.cu) grouped GEMMs.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {

__device__ __forceinline__ GemmGroup GroupOf(const GemmParams& p, const GemmGroup& single,
                                             int g) {
  if (p.routed_ids != nullptr) {
    const int32_t e = p.routed_ids[g];
    if (e < 0 || e >= p.routed_experts) {
      if (threadIdx.x == 0) atomicMin(p.routing_verdict, p.routing_code);
      return {nullptr, g, 0};
    }
    const void* w = p.routed_w[e];
    return {w, g, w != nullptr ? 1 : 0};
  }
  if (p.row_chunk > 0) {
    const int64_t begin = g * p.row_chunk;
    return {single.w, single.row_begin + begin,
            Max64(0, Min64(p.row_chunk, single.row_count - begin))};
  }
  return p.groups != nullptr ? p.groups[g] : single;
}

// An fp8 e4m3 code (the low byte of b) as float, exactly (kernels/tensor.h: E4m3ToF32): the 7
// magnitude bits into fp32's exponent and mantissa, 2^120 re-biasing the exponent (fp32
// denormals keep e4m3's subnormals exact; codes are checked at load to hold no NaN).
__device__ __forceinline__ float E4m3ToFloat(uint32_t b) {
  const float mag = __uint_as_float((b & 0x7fu) << 20) * 0x1p120f;
  return __uint_as_float(__float_as_uint(mag) | ((b & 0x80u) << 24));
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

// Int4 codes (w >> shift) & 0xf and (w >> (shift + 16)) & 0xf (shift 0, 4, 8 or 12) as the bf16
// pair (128 + q, 128 + q'): the codes in the low mantissa bits of 128.0. One lop3, (a & mask) |
// bias with the bias in a register: written in C++, both constants immediates, it was two (ncu's
// SASS, stop 45).
__device__ __forceinline__ uint32_t BiasedCodePair(uint32_t w, int shift) {
  const uint32_t bias = 0x43004300u;
  uint32_t out;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(out) : "r"(w >> shift), "n"(0x000f000f), "r"(bias));
  return out;
}

// The same less 128 (a bf16x2 subtraction, exact): the codes (q, q') themselves.
__device__ __forceinline__ uint32_t CodePair(uint32_t w, int shift) {
  const uint32_t biased = BiasedCodePair(w, shift), k128 = 0x43004300u;
  const __nv_bfloat162 q = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   *reinterpret_cast<const __nv_bfloat162*>(&k128));
  return *reinterpret_cast<const uint32_t*>(&q);
}

// 4 bytes at any alignment, little-endian (matrices at odd addresses).
__device__ __forceinline__ uint32_t LoadU32Bytes(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// xr[j] = row j of the pass of rows [m0, m0 + nt) of group g's A, j < TB (rows past nt repeat
// row m0: computed, never stored).
template <int TB>
__device__ __forceinline__ void RowsOfA(const GemmParams& p, const GemmGroup& g, int64_t m0,
                                        int nt, const float* (&xr)[TB]) {
#pragma unroll
  for (int j = 0; j < TB; ++j) {
    const int64_t r = g.row_begin + m0 + (j < nt ? j : 0);
    xr[j] = p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda;
  }
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

// ---- the tensor-core matrix-vector kernels (int4: matmul_quant.cu, bf16: matmul.cu) -----------
// A warp takes 16 weight rows (the M of mma.m16n8k16) against up to 8 rows of A (the N: one token
// a column) per n-tile, one or two n-tiles (int4: 16 rows of A, each weight fragment serving both),
// K in chunks of 64 elements, optionally split over ws warps. x goes in as bf16 hi + lo (16 bits of
// mantissa, two products), made once per block into shared memory.
constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * kWarp;
constexpr int kMmaChunk = 64;   // elements (codes) per chunk
constexpr int kMmaTokens = 8;   // rows of A per n-tile: the n of m16n8k16
constexpr int kMmaMaxTiles = 2;                           // n-tiles a warp may take
constexpr int kMmaSumStride = kMmaTokens * kMmaMaxTiles;  // xsum floats a chunk
constexpr size_t kMmaMaxSmem = 100 * 1024;  // x fragments a block; leaves room for 2 blocks an SM

// Shared memory of the x fragments: per row of A 64 words a chunk, [4 quarters][4 lanes t][4
// words], so the 4 lanes of a row read 64 contiguous bytes at a time; rows 64 c + 16 words apart,
// so rows g and g + 1 of one quarter-warp fall on different banks.
__host__ __device__ constexpr int64_t MmaRowWords(int64_t chunks) { return chunks * 64 + 16; }
__host__ __device__ constexpr size_t MmaSmemBytes(int64_t rows, int64_t chunks) {
  // fragments, per-(row, chunk, t) partial sums, per-(chunk, row) sums
  return sizeof(uint32_t) *
         (rows * MmaRowWords(chunks) + rows * chunks * 4 + chunks * kMmaSumStride);
}

// How a tensor-core matrix-vector block splits K: over kWays warps of the block, each block
// staging all of x, or (kBlocks) over kWays blocks of a cluster, each staging only its slice of x
// (MmaMatVecStore adds the slices up). A split over warps staged all of x in every block: as many
// bytes from L2 as weights at 8 rows of bf16 A and 8 slices, and most of the kernel's stalls; over
// blocks it costs what a cluster launch costs, so it is taken where x is at least half of a
// block's weights (LaunchMmaMatVec; ncu and moe-bench, tests/bench/NOTES.md, stop 47).
template <int kWays, bool kBlocks>
struct KSplit {
  static constexpr int ways = kWays;
  static constexpr bool blocks = kBlocks;
};
using KWhole = KSplit<1, false>;

// Where a tensor-core matrix-vector warp works: its block's x fragments in shared memory (StageMmaX
// fills them: chunks [x_begin, x_begin + x_count)), its 16 weight rows (ra, rb: lane g's rows g and
// g + 8, row 0 past N: computed, never stored) and its K slice of chunks [c_begin, c_end).
struct MmaWarp {
  int nt, chunks, g, t;  // chunks: of the shared-memory layout
  int64_t row_words, n0, ra, rb;
  int c_begin, c_end, x_begin, x_count;
  uint32_t* xf;          // [row][chunk - x_begin][4][t][4]
  float* xpart;          // [row][chunk - x_begin][t]
  float* xsum;           // [chunk - x_begin][kMmaSumStride rows]
  const uint32_t* xrow;  // lane g's row of x fragments at its t

  template <typename Split>
  __device__ __forceinline__ static MmaWarp Make(const GemmParams& p, const GemmGroup& grp,
                                                 uint32_t* smem) {
    return Make<Split>(p, grp, smem, blockIdx.x);
  }
  // The same for block bx of the group: row-block bx (kMmaWarps / ways m-tiles of 16 rows) with
  // K split over its warps, or slice bx % ways of row-block bx / ways (kMmaWarps m-tiles) with K
  // split over the blocks of a cluster.
  template <typename Split>
  __device__ __forceinline__ static MmaWarp Make(const GemmParams& p, const GemmGroup& grp,
                                                 uint32_t* smem, int64_t bx) {
    constexpr int ws = Split::ways;
    MmaWarp w;
    const int all_chunks = static_cast<int>(p.K / kMmaChunk);
    const int per_slice = (all_chunks + ws - 1) / ws;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    int slice;
    if constexpr (Split::blocks) {
      w.n0 = (bx / ws * kMmaWarps + warp) * 16;
      slice = static_cast<int>(bx % ws);
    } else {
      w.n0 = (bx * (kMmaWarps / ws) + warp / ws) * 16;
      slice = warp % ws;
    }
    w.c_begin = slice * per_slice;
    w.c_end = min(all_chunks, w.c_begin + per_slice);
    w.chunks = Split::blocks ? per_slice : all_chunks;
    w.x_begin = Split::blocks ? w.c_begin : 0;
    w.x_count = Split::blocks ? w.c_end - w.c_begin : all_chunks;
    w.nt = static_cast<int>(grp.row_count);
    w.row_words = MmaRowWords(w.chunks);
    w.xf = smem;
    w.xpart = reinterpret_cast<float*>(w.xf + p.max_rows * w.row_words);
    w.xsum = w.xpart + p.max_rows * w.chunks * 4;
    w.g = lane / 4, w.t = lane % 4;
    w.ra = w.n0 + w.g < p.N ? w.n0 + w.g : 0;
    w.rb = w.n0 + w.g + 8 < p.N ? w.n0 + w.g + 8 : 0;
    w.xrow = w.xf + w.g * w.row_words + 4 * w.t;
    return w;
  }

  // The lane's x fragments of chunk c for n-tile `tile` (row 8 tile + g; StageMmaX's order),
  // zeros where it supplies no row.
  __device__ __forceinline__ void LoadX(int c, uint32_t (&xw)[16], int tile = 0) const {
    const bool has_x = kMmaTokens * tile + g < nt;
    const uint32_t* at = xrow + kMmaTokens * tile * row_words + (c - x_begin) * 64;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 q =
          has_x ? *reinterpret_cast<const uint4*>(at + 16 * v) : make_uint4(0u, 0u, 0u, 0u);
      xw[4 * v] = q.x, xw[4 * v + 1] = q.y, xw[4 * v + 2] = q.z, xw[4 * v + 3] = q.w;
    }
  }
  // xsum of chunk c: its kMmaSumStride rows.
  __device__ __forceinline__ const float* SumsOf(int c) const {
    return xsum + (c - x_begin) * kMmaSumStride;
  }
};

// The nt rows of A of group grp, chunks [x_begin, x_begin + x_count), as x fragments in shared
// memory, and their sums per chunk: unit (row j, chunk c, lane t) holds positions 64c + 16t + [0,
// 16) in the order of the k-steps: k-step s (0..3) takes positions i and i + 4, i = 8 (s / 2) + 2
// (s % 2) (b0) and i + 1, i + 5 (b1), as hi, lo: words {b0 hi, b1 hi, b0 lo, b1 lo} in quarter s,
// so that each product's (b0, b1) is a register pair as LDS.128 loads it (the order {b0 hi, b0 lo,
// ...} cost ~50 register moves a chunk in the int4 kernel: ncu, tests/bench/NOTES.md, stop 45).
// xsum[c][j] (stride kMmaSumStride): sum of row j's chunk c (of hi + lo: the values the products
// see), zero for j >= nt. Ends with a barrier.
__device__ __forceinline__ void StageMmaX(const GemmParams& p, const GemmGroup& grp,
                                          const MmaWarp& mw) {
  const int count = mw.x_count;
  for (int u = threadIdx.x; u < mw.nt * count * 4; u += blockDim.x) {
    const int tq = u % 4;
    const int64_t c = (u / 4) % count, j = u / (4 * count);
    const int64_t r = grp.row_begin + j;
    const float4* x4 =
        reinterpret_cast<const float4*>(p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda +
                                        (mw.x_begin + c) * kMmaChunk + 16 * tq);
    float x[16];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const float4 f = x4[v];
      x[4 * v] = f.x, x[4 * v + 1] = f.y, x[4 * v + 2] = f.z, x[4 * v + 3] = f.w;
    }
    uint32_t frag[16];
    float sum = 0.f;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int i = 8 * (s / 2) + 2 * (s % 2);
      SplitBf16x2(x[i], x[i + 4], frag[4 * s], frag[4 * s + 2], sum);
      SplitBf16x2(x[i + 1], x[i + 5], frag[4 * s + 1], frag[4 * s + 3], sum);
    }
    uint32_t* dst = mw.xf + j * mw.row_words + c * 64 + 4 * tq;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      *reinterpret_cast<uint4*>(dst + 16 * v) =
          make_uint4(frag[4 * v], frag[4 * v + 1], frag[4 * v + 2], frag[4 * v + 3]);
    }
    mw.xpart[(j * mw.chunks + c) * 4 + tq] = sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < count * kMmaSumStride; i += blockDim.x) {
    const int c = i / kMmaSumStride, j = i % kMmaSumStride;
    const float* s4 = mw.xpart + (j * mw.chunks + c) * 4;
    mw.xsum[i] = j < mw.nt ? (s4[0] + s4[1]) + (s4[2] + s4[3]) : 0.f;
  }
  __syncthreads();
}

// The end of a tensor-core matrix-vector warp: acc[x][m] = its mma accumulator of n-tile x (rows
// n0 + g and n0 + g + 8, columns (rows of A) 8x + 2t and 8x + 2t + 1) of matrix m (gate, up); the
// K slices of a row summed in slice order through `partial` ([kMmaWarps][NT * NW * 4][kWarp]
// floats a block) by the first slice's warp, or for slices over blocks by the cluster's first
// block, reading the others' through distributed shared memory; then stored (SiLU(gate) * up for
// kGlu).
template <bool kGlu, typename Split, int NT>
__device__ __forceinline__ void MmaMatVecStore(const GemmParams& p, const GemmGroup& grp,
                                               int64_t n0, float (&acc)[NT][kGlu ? 2 : 1][4],
                                               float* partial) {
  constexpr int NW = kGlu ? 2 : 1, kPer = NT * NW * 4, ws = Split::ways;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  float* const flat = &acc[0][0][0];  // [x][m][i]
  if constexpr (ws > 1) {
    float* mine = partial + warp * kPer * kWarp + lane;
#pragma unroll
    for (int i = 0; i < kPer; ++i) mine[i * kWarp] = flat[i];
    if constexpr (Split::blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters (MmaMatVecSlicedKernel)
      cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      cluster.sync();
      const bool first = cluster.block_rank() == 0;
      if (first) {
        for (int s2 = 1; s2 < ws; ++s2) {
          const float* theirs = cluster.map_shared_rank(mine, s2);
#pragma unroll
          for (int i = 0; i < kPer; ++i) flat[i] += theirs[i * kWarp];
        }
      }
      cluster.sync();  // the other slices' `partial` stays until the first has read it
      if (!first) return;
#endif
    } else {
      __syncthreads();
      if (warp % ws != 0) return;
      for (int s2 = 1; s2 < ws; ++s2) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) flat[i] += mine[(s2 * kPer + i) * kWarp];
      }
    }
  }
  const int nt = static_cast<int>(grp.row_count);
#pragma unroll
  for (int x = 0; x < NT; ++x) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + g + 8 * (i / 2);
      const int j = kMmaTokens * x + 2 * t + i % 2;  // row of A
      float v = acc[x][0][i];
      if constexpr (kGlu) v = v / (1.f + expf(-v)) * acc[x][1][i];
      if (n < p.N && j < nt) StoreC(p, grp.row_begin + j, n, v);
    }
  }
}

// The round loop of a tensor-core matrix-vector warp over chunks [c_begin, c_end), kU chunks a
// round in two register buffers (compile-time indices): load_round(buffer, c0) issues a round's
// loads, compute_round(buffer, c0) its products; the next round's loads go out before this
// round's products. The caller has loaded the first round into buffer 0.
template <int kU, typename Load, typename Compute>
__device__ __forceinline__ void MmaRounds(int c_begin, int c_end, Load& load_round,
                                          Compute& compute_round) {
  using First = std::integral_constant<int, 0>;
  using Second = std::integral_constant<int, 1>;
  for (int c0 = c_begin; c0 < c_end; c0 += 2 * kU) {
    if (c0 + kU < c_end) load_round(Second{}, c0 + kU);
    compute_round(First{}, c0);
    if (c0 + kU >= c_end) break;
    if (c0 + 2 * kU < c_end) load_round(First{}, c0 + 2 * kU);
    compute_round(Second{}, c0 + kU);
  }
}

// The tensor-core matrix-vector kernel of weight format Fmt (Int4Mma in matmul_quant.cu, Bf16Mma
// in matmul.cu): Fmt::kAlign, the alignment in bytes its wide loads need of every matrix;
// Fmt::kMaxSmem, the most shared memory a block may ask; Fmt::kTiles, its n-tiles; Fmt::kBits, a
// weight's bits; Fmt::Body<kGlu, Split, kAligned>(p, grp, partial), a warp's work. The body is
// instanced for aligned matrices and for others (byte loads) and chosen once per block, so that
// its loop has no branch. Block: kMmaWarps warps, K split as `Split` says (KSplit); grid
// (row-blocks * (ways if the split is over blocks), groups). A group's row_count <= kMmaTokens *
// Fmt::kTiles.
template <typename Fmt, bool kGlu, typename Split>
__device__ __forceinline__ void MmaMatVecBlock(const GemmParams& p, const GemmGroup& single) {
  WaitForPriorKernel();
  __shared__ float partial[Split::ways > 1 ? kMmaWarps * Fmt::kTiles * (kGlu ? 8 : 4) * kWarp : 1];
  const GemmGroup grp = GroupOf(p, single, blockIdx.y);
  if (grp.row_count == 0) return;  // uniform over a cluster: its blocks share the group
  bool aligned = reinterpret_cast<uintptr_t>(grp.w) % Fmt::kAlign == 0;
  if constexpr (kGlu) {
    aligned = aligned && reinterpret_cast<uintptr_t>(UpOf(p, blockIdx.y)) % Fmt::kAlign == 0;
  }
  if (aligned) {
    Fmt::template Body<kGlu, Split, true>(p, grp, partial);
  } else {
    Fmt::template Body<kGlu, Split, false>(p, grp, partial);
  }
}

// K over ws warps of a block.
template <typename Fmt, bool kGlu, int ws>
__global__ __launch_bounds__(kMmaThreads, Fmt::kTiles == 1 ? 2 : 1) void MmaMatVecKernel(
    const GemmParams p, const GemmGroup single) {
  MmaMatVecBlock<Fmt, kGlu, KSplit<ws, false>>(p, single);
}

#ifdef MOE_CUDA_WGMMA  // a build for sm_90a: clusters
// Clusters exist from sm_90 on. A build for older GPUs as well ("80;90a") compiles the kernel for
// them without its cluster and without a body; ClusterLaunch keeps it from running there.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define MOE_CLUSTER_DIMS(n) __cluster_dims__(n, 1, 1)
#else
#define MOE_CLUSTER_DIMS(n)
#endif
// K over the ws blocks of a cluster.
template <typename Fmt, bool kGlu, int ws>
__global__ MOE_CLUSTER_DIMS(ws)
    __launch_bounds__(kMmaThreads,
                      Fmt::kTiles == 1 ? 2 : 1) void MmaMatVecSlicedKernel(const GemmParams p,
                                                                           const GemmGroup single) {
#if __CUDA_ARCH__ >= 900
  MmaMatVecBlock<Fmt, kGlu, KSplit<ws, true>>(p, single);
#endif
}
#undef MOE_CLUSTER_DIMS

// Whether the device launches clusters (compute capability 9.0 or later).
inline bool ClusterLaunch() {
  static const bool has = [] {
    int device = 0, major = 0;
    MOE_CUDA_CHECK(cudaGetDevice(&device));
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 9;
  }();
  return has;
}
#endif

// kKernel with `smem` bytes of dynamic shared memory (up to Fmt::kMaxSmem), grid.x `blocks`.
template <typename Fmt, auto kKernel>
void LaunchMmaMatVecAt(const GemmParams& p, const GemmGroup& single, size_t smem, int64_t blocks,
                       cudaStream_t stream) {
  static const bool attr = [] {  // once per instance: more than 48 KiB of dynamic shared memory
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(Fmt::kMaxSmem)));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.num_groups));
  Launch(kKernel, grid, kMmaWarps * kWarp, smem, stream, p, single);
}

// K in ws slices: over warps (`smem` bytes of x, all of it), or over the blocks of clusters
// (each block its slice's x).
template <typename Fmt, bool kGlu, int ws>
void LaunchMmaMatVecSplit(const GemmParams& p, const GemmGroup& single, size_t smem, bool blocks,
                          cudaStream_t stream) {
  const int64_t m_tiles = CeilDiv(p.N, 16);
#ifdef MOE_CUDA_WGMMA
  if (blocks) {
    const size_t slice_smem = MmaSmemBytes(p.max_rows, CeilDiv(p.K / kMmaChunk, ws));
    LaunchMmaMatVecAt<Fmt, MmaMatVecSlicedKernel<Fmt, kGlu, ws>>(
        p, single, slice_smem, CeilDiv(m_tiles, kMmaWarps) * ws, stream);
    return;
  }
#endif
  LaunchMmaMatVecAt<Fmt, MmaMatVecKernel<Fmt, kGlu, ws>>(p, single, smem,
                                                         CeilDiv(m_tiles * ws, kMmaWarps), stream);
}

// MmaMatVecKernel<Fmt> with `smem` bytes of x, K split in ws slices (1, 2, 4 or 8) while `wave`
// blocks (what the GPU holds at once) are not exceeded and each slice keeps 4 chunks; the slices
// over blocks (a build for sm_90a, on a GPU with clusters) where x is at least half of what a block
// of the split over warps reads of the weights: max_rows x 4 bytes a column against 128 / ws weight
// rows of Fmt::kBits.
template <typename Fmt>
void LaunchMmaMatVec(const GemmParams& p, const GemmGroup& single, size_t smem, int64_t wave,
                     cudaStream_t stream) {
  const int64_t tiles = CeilDiv(p.N, 16) * p.num_groups, chunks = p.K / kMmaChunk;
  int ws = 1;
  while (ws < 8 && CeilDiv(tiles * ws * 2, kMmaWarps) <= wave && chunks >= 4 * ws) ws *= 2;
  bool blocks = p.max_rows * ws >= 2 * Fmt::kBits;
#ifdef MOE_CUDA_WGMMA
  blocks = blocks && ClusterLaunch();
#endif
  const bool glu = p.glu();
  switch (ws) {
    case 1:
      glu ? LaunchMmaMatVecSplit<Fmt, true, 1>(p, single, smem, false, stream)
          : LaunchMmaMatVecSplit<Fmt, false, 1>(p, single, smem, false, stream);
      break;
    case 2:
      glu ? LaunchMmaMatVecSplit<Fmt, true, 2>(p, single, smem, blocks, stream)
          : LaunchMmaMatVecSplit<Fmt, false, 2>(p, single, smem, blocks, stream);
      break;
    case 4:
      glu ? LaunchMmaMatVecSplit<Fmt, true, 4>(p, single, smem, blocks, stream)
          : LaunchMmaMatVecSplit<Fmt, false, 4>(p, single, smem, blocks, stream);
      break;
    default:
      glu ? LaunchMmaMatVecSplit<Fmt, true, 8>(p, single, smem, blocks, stream)
          : LaunchMmaMatVecSplit<Fmt, false, 8>(p, single, smem, blocks, stream);
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
// Its tile is kGemmTileRows x kGemmTileCols of C.
constexpr int kGemmTileRows = 64, kGemmTileCols = 128;
bool LaunchGemmMma(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);

// The pipelined GEMM on p.a_split (gemm_mma.cu), for LaunchGroupedGemm past the matrix-vector
// sizes. WgmmaGemm: whether it runs on wgmma (a build for sm_90a, MOE_CUDA_WGMMA; a Hopper
// device; MOE_GEMM_WGMMA=0 keeps the mma.sync kernel, for measurements).
void LaunchPipelinedGemm(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);
bool WgmmaGemm();

// The quantized path of LaunchGroupedGemm (matmul_quant.cu): p.w_dtype is kQ8, kQ4, kQ2 or kF8.
void DispatchQuant(const GemmParams& p, const GemmGroup& single, cudaStream_t stream);

}  // namespace moe::kernels::cuda
