// The grouped GEMM on the tensor cores (prefill, and decode groups past kMatVecMaxRows rows):
// C = A Wᵀ for bf16 and quantized (kQ8/kQ4/kQ2/kF8) weights, by mma.sync m16n8k16 (bf16 operands,
// fp32 accumulation). fp32 and fp16 weights, K not a multiple of 32 and A rows not 16-byte
// aligned keep the SIMT tiled kernels (matmul.cu, matmul_quant.cu).
//
// Precision: A is fp32; against bf16 weights it enters as bf16 hi + lo (hi + lo = a to ~2^-16
// relative), two products per step, as in the bf16 matrix-vector kernel that batch 1 runs. A
// quantized weight w = q s + m (s, m per group of the row) enters as its code q, exact in bf16 for
// q < 256, against A as hi + mid + lo (fp32's 24 bits, three products a step): batch 1 runs the
// int8 and fp8 codes on SIMT kernels with fp32 x, and with two parts a batch of 24 sequences
// differed from each alone by 1.2-1.8e-3 on the GPTQ-asym, fp8 and compressed-tensors fp8
// fixtures, against their 1e-3 (three parts, emulated on the CPU: under 4e-4; tests/bench/NOTES.md,
// stops 43 and 45). Each k-tile (32 or 64 wide) lies in one group, so its products sum_k a q are
// scaled once per tile: acc += s (sum_k a q) + m (sum_k a).
// k-tiles of 64 halve the barriers and the per-tile s/m scalings a product: the prefill's int4
// expert GEMMs went 830 -> 667 us a launch (H200); bf16 GEMMs, prefill or decode, did not move
// (tests/bench/NOTES.md, stop 40). 32 where K or the quant group does not allow 64.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma_smem.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace moe::kernels::cuda {
namespace {

// Block tile kTileM x kTileN of C, K in k-tiles of KT (32 or 64: a template parameter); 8 warps
// as 2 (M) x 4 (N), each 32 x 32 of C: two m-tiles of 16 by four n-tiles of 8.
constexpr int kTileM = kGemmTileRows, kTileN = kGemmTileCols, kGemmThreads = 256;
// A tile row's bf16 pairs, padded by 4 words so that the fragment loads of rows g = 0..7 (stride
// 20 or 36 words) fall on 32 distinct banks.
template <int KT>
constexpr int kRowWords = KT / 2 + 4;

__device__ __forceinline__ uint32_t PackBf16(float lo_half, float hi_half) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo_half, hi_half);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The n little-endian words at p, any alignment.
template <int n>
__device__ __forceinline__ void LoadWordsBytewise(const uint8_t* p, uint32_t (&w)[n]) {
#pragma unroll
  for (int i = 0; i < n; ++i) w[i] = LoadU32Bytes(p + 4 * i);
}

// The n aligned little-endian words at p by the widest loads their count allows.
template <int n>
__device__ __forceinline__ void LoadWordsAligned(const uint8_t* p, uint32_t (&w)[n]) {
  if constexpr (n % 4 == 0) {
#pragma unroll
    for (int i = 0; i < n / 4; ++i) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = a.x, w[4 * i + 1] = a.y, w[4 * i + 2] = a.z, w[4 * i + 3] = a.w;
    }
  } else if constexpr (n == 2) {
    const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = a.x, w[1] = a.y;
  } else {
    static_assert(n == 1, "1, 2 or a multiple of 4 words");
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
  }
}

// log2 of the quant group size, for shifts in place of divisions: group sizes are powers of two
// (DispatchQuant checks), and a 64-bit division is a call of tens of instructions a k-tile.
__device__ __forceinline__ int GroupShift(const GemmParams& p) { return __ffs(p.group_size) - 1; }

// The weight formats. Each loader thread takes E consecutive elements [k, k + E) of one weight
// row (E = KT / 2: 16 or 32): Load fetches them (aligned: the widest loads; otherwise byte by
// byte), Pairs makes them E / 2 bf16 pairs. Quantized ones also carry the row's {s, m} for the
// k-tile's group.
template <int E>
struct Bf16Weights {
  static constexpr bool kQuant = false;
  uint32_t raw[E / 2];
  __device__ __forceinline__ void Load(const GemmParams& p, const void* w, int64_t n, int64_t k,
                                       bool aligned) {
    const uint8_t* at = static_cast<const uint8_t*>(w) + (n * p.K + k) * 2;
    if (aligned) {
      LoadWordsAligned(at, raw);
    } else {
      LoadWordsBytewise(at, raw);
    }
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) raw[i] = 0u;
  }
  __device__ __forceinline__ void Pairs(uint32_t (&out)[E / 2]) const {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) out[i] = raw[i];
  }
};

template <int B, int E>
struct QuantWeights {
  static constexpr bool kQuant = true;
  static constexpr int kWords = E * B / 32;  // E codes of B bits
  uint32_t raw[kWords];
  float2 sm;
  __device__ __forceinline__ void Load(const GemmParams& p, const void* w, int64_t n, int64_t k,
                                       bool aligned) {
    const int shift = GroupShift(p);
    const int64_t row_bytes = p.K * B / 8, groups = (p.K + p.group_size - 1) >> shift;
    const uint8_t* base = static_cast<const uint8_t*>(w);
    const uint8_t* codes = base + n * row_bytes + k * B / 8;
    const uint8_t* params = base + (p.N * row_bytes + 15) / 16 * 16 +  // QuantParamsOffset
                            (n * groups + (k >> shift)) * 4;
    uint32_t pw;
    if (aligned) {
      LoadWordsAligned(codes, raw);
      pw = __ldg(reinterpret_cast<const uint32_t*>(params));
    } else {
      LoadWordsBytewise(codes, raw);
      pw = LoadU32Bytes(params);
    }
    __half_raw s, m;
    s.x = static_cast<unsigned short>(pw & 0xffffu);
    m.x = static_cast<unsigned short>(pw >> 16);
    sm = make_float2(__half2float(__half(s)), __half2float(__half(m)));
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) raw[i] = 0u;
    sm = make_float2(0.f, 0.f);
  }
  __device__ __forceinline__ void Pairs(uint32_t (&out)[E / 2]) const {
    constexpr uint32_t kMask = (1u << B) - 1u;
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const int bit0 = 2 * i * B, bit1 = bit0 + B;  // compile-time after unrolling
      const uint32_t q0 = (raw[bit0 / 32] >> (bit0 % 32)) & kMask;
      const uint32_t q1 = (raw[bit1 / 32] >> (bit1 % 32)) & kMask;
      out[i] = PackBf16(static_cast<float>(q0), static_cast<float>(q1));
    }
  }
};

// kF8 weights (e4m3 codes, an fp32 scale s per group): each code enters as its value, exact in
// bf16, with {s, 0} for the tile's group: acc += s (sum_k a e4m3(q)). Loads as int8's.
template <int E>
struct F8Weights : QuantWeights<8, E> {
  __device__ __forceinline__ void Load(const GemmParams& p, const void* w, int64_t n, int64_t k,
                                       bool aligned) {
    QuantWeights<8, E>::Load(p, w, n, k, aligned);  // codes; the params word is the fp32 scale
    const int shift = GroupShift(p);
    const uint8_t* params = static_cast<const uint8_t*>(w) + (p.N * p.K + 15) / 16 * 16 +
                            (n * ((p.K + p.group_size - 1) >> shift) + (k >> shift)) * 4;
    this->sm =
        make_float2(__uint_as_float(aligned ? __ldg(reinterpret_cast<const uint32_t*>(params))
                                            : LoadU32Bytes(params)),
                    0.f);
  }
  __device__ __forceinline__ void Pairs(uint32_t (&out)[E / 2]) const {
#pragma unroll
    for (int i = 0; i < E / 2; ++i) {
      const int bit0 = 16 * i;  // compile-time after unrolling
      out[i] = PackBf16(E4m3ToFloat(this->raw[bit0 / 32] >> (bit0 % 32)),
                        E4m3ToFloat(this->raw[bit0 / 32] >> (bit0 % 32 + 8)));
    }
  }
};

// Grid (ceil(N / kTileN), ceil(max_rows / kTileM), groups or k_splits); K a multiple of KT, A rows
// 16-byte aligned, quantized groups a multiple of KT (LaunchGemmMma checks all three). Fmt's
// loaders take KT / 2 elements.
template <typename Fmt, int KT>
__global__ __launch_bounds__(kGemmThreads, 2) void GemmMmaKernel(const GemmParams p,
                                                                 const GemmGroup single) {
  constexpr int kTileK = KT, kRow = kRowWords<KT>, kA = KT / 4;  // kA: A floats a loader thread
  constexpr int kParts = Fmt::kQuant ? 3 : 2;  // A's bf16 parts (the precision note above)
  WaitForPriorKernel();
  // blockIdx.z: the K slice (one matrix only: no groups table, no routed groups)
  const bool split = p.k_splits > 1 && p.groups == nullptr && p.routed_ids == nullptr;
  const GemmGroup grp = GroupOf(p, single, split ? 0 : blockIdx.z);
  const int64_t k_slice = split ? CeilDiv(CeilDiv(p.K, kTileK), p.k_splits) * kTileK : p.K;
  const int64_t k_begin = split ? blockIdx.z * k_slice : 0;
  const int64_t k_end = Min64(p.K, k_begin + k_slice);
  if (k_begin >= k_end) return;  // block-uniform
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  if (m0 >= grp.row_count) return;  // block-uniform
  __shared__ __align__(16) uint32_t a_s[kParts][kTileM][kRow];  // hi, [mid,] lo
  __shared__ __align__(16) uint32_t w_s[kTileN][kRow];
  __shared__ float a_sum[kTileM];   // quantized: sum_k of A's parts over the k-tile, per row
  __shared__ float2 w_sm[kTileN];   // quantized: {s, m} of the k-tile's group, per weight row

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t = lane % 4;
  // Loaders: A row tid / 4, k (tid % 4) kA .. + kA; W row tid / 2, k (tid % 2) KT / 2 .. + KT / 2.
  const int la = tid / 4, lka = (tid % 4) * kA, lw = tid / 2, lkw = (tid % 2) * (KT / 2);
  const float* arow = nullptr;
  if (m0 + la < grp.row_count) {
    const int64_t r = grp.row_begin + m0 + la;
    arow = p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda;
  }
  const bool has_w = n0 + lw < p.N;
  const bool aligned = (reinterpret_cast<uintptr_t>(grp.w) & 15) == 0;

  float4 xa[kA / 4];
  Fmt wf;
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < kA / 4; ++i) xa[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (arow != nullptr) {
      const float4* x4 = reinterpret_cast<const float4*>(arow + k0 + lka);
#pragma unroll
      for (int i = 0; i < kA / 4; ++i) xa[i] = x4[i];
    }
    if (has_w) {
      wf.Load(p, grp.w, n0 + lw, k0 + lkw, aligned);
    } else {
      wf.Zero();
    }
  };
  auto stage = [&]() {
    float sum = 0.f;  // quantized: of what the parts hold, in order
#pragma unroll
    for (int v = 0; v < kA / 8; ++v) {  // 8 floats of A: 4 bf16 pairs a part, one 16-byte store
      uint32_t parts[4][kParts];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4& f4 = xa[2 * v + i / 2];
        SplitBf16(i % 2 == 0 ? f4.x : f4.z, i % 2 == 0 ? f4.y : f4.w, parts[i]);
        if constexpr (Fmt::kQuant) {
          float sx = 0.f, sy = 0.f;
#pragma unroll
          for (int q = 0; q < kParts; ++q) {
            const float2 f =
                __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&parts[i][q]));
            sx += f.x, sy += f.y;
          }
          sum += sx + sy;
        }
      }
#pragma unroll
      for (int q = 0; q < kParts; ++q) {
        *reinterpret_cast<uint4*>(&a_s[q][la][lka / 2 + 4 * v]) =
            make_uint4(parts[0][q], parts[1][q], parts[2][q], parts[3][q]);
      }
    }
    uint32_t wp[KT / 4];
    wf.Pairs(wp);
#pragma unroll
    for (int i = 0; i < KT / 16; ++i) {
      *reinterpret_cast<uint4*>(&w_s[lw][lkw / 2 + 4 * i]) =
          make_uint4(wp[4 * i], wp[4 * i + 1], wp[4 * i + 2], wp[4 * i + 3]);
    }
    if constexpr (Fmt::kQuant) {
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (tid % 4 == 0) a_sum[la] = sum;
      if (tid % 2 == 0) w_sm[lw] = wf.sm;
    }
  };

  const int wm = 32 * (warp / 4), wn = 32 * (warp % 4);  // the warp's 32 x 32 of the block tile
  float acc[2][4][4] = {};
  float part[2][4][4];  // quantized: the k-tile's code products, before s and m
  load(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    __syncthreads();  // the previous tile's fragments have been read
    stage();
    __syncthreads();
    if (k0 + kTileK < k_end) load(k0 + kTileK);  // in flight during this tile's products
    if constexpr (Fmt::kQuant) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) part[i][j][e] = 0.f;
        }
      }
    }
    float (&dst)[2][4][4] = Fmt::kQuant ? part : acc;
#pragma unroll
    for (int ks = 0; ks < kTileK / 16; ++ks) {
      const int c = 8 * ks + t;  // word of columns 2t, 2t + 1 of this k-step; + 4: 2t + 8, 2t + 9
      uint32_t b[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn + 8 * j + g;
        b[j][0] = w_s[n][c], b[j][1] = w_s[n][c + 4];
      }
      // Each accumulator takes the k-step's parts in order, hi first.
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm + 16 * i + g;
#pragma unroll
        for (int q = 0; q < kParts; ++q) {
          const uint32_t a0 = a_s[q][r][c], a1 = a_s[q][r + 8][c];
          const uint32_t a2 = a_s[q][r][c + 4], a3 = a_s[q][r + 8][c + 4];
#pragma unroll
          for (int j = 0; j < 4; ++j) MmaBf16(dst[i][j], a0, a1, a2, a3, b[j][0], b[j][1]);
        }
      }
    }
    if constexpr (Fmt::kQuant) {  // acc += s (sum a q) + m (sum a), per (row, weight row)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float s0 = a_sum[wm + 16 * i + g], s1 = a_sum[wm + 16 * i + g + 8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 c0 = w_sm[wn + 8 * j + 2 * t], c1 = w_sm[wn + 8 * j + 2 * t + 1];
          acc[i][j][0] = fmaf(c0.x, part[i][j][0], fmaf(c0.y, s0, acc[i][j][0]));
          acc[i][j][1] = fmaf(c1.x, part[i][j][1], fmaf(c1.y, s0, acc[i][j][1]));
          acc[i][j][2] = fmaf(c0.x, part[i][j][2], fmaf(c0.y, s1, acc[i][j][2]));
          acc[i][j][3] = fmaf(c1.x, part[i][j][3], fmaf(c1.y, s1, acc[i][j][3]));
        }
      }
    }
  }
  // c = C[g][2t, 2t + 1], C[g + 8][2t, 2t + 1] of each 16 x 8 tile.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + wm + 16 * i + g + 8 * h;
      if (m >= grp.row_count) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + wn + 8 * j + 2 * t;
        if (n < p.N) StoreC(p, grp.row_begin + m, n, acc[i][j][2 * h]);
        if (n + 1 < p.N) StoreC(p, grp.row_begin + m, n + 1, acc[i][j][2 * h + 1]);
      }
    }
  }
}

// k-tiles of 64 where K and the quant groups allow, else 32. MOE_GEMM_KTILE=32 keeps 32 everywhere
// (a measurement switch).
int GemmKTile(const GemmParams& p) {
  static const bool wide = [] {
    const char* env = std::getenv("MOE_GEMM_KTILE");
    return env == nullptr || std::strcmp(env, "32") != 0;
  }();
  const bool fits = p.K % 64 == 0 && (p.w_dtype == DType::kBF16 || p.group_size % 64 == 0);
  return wide && fits ? 64 : 32;
}

// ---- A split once a call: the pipelined kernel (int4 and bf16 weights) -------------------------
// The kernel above converts its A tile into bf16 hi + lo in each of the N / 128 blocks that read
// it (and turns int4 codes into bf16 one at a time), through one shared-memory stage: most of its
// instructions, and each k-tile's load latency exposed (ncu, tests/bench/NOTES.md, stop 15). Here
// A is split once a call instead (SplitForGemmKernel), so that A, the weights (and for int4 the
// {s, m} and A's sums) reach shared memory by cp.async through kPipeStages stages, fragments by
// ldmatrix. Block and warp tiles as above, k-tiles of 64.
// bf16 weights: W's tile as it is in memory, B fragments by ldmatrix; A split in column order.
// int4 weights (groups a multiple of 64): a lane makes the bf16 pairs of 8 codes from one 32-bit
// word: ((w >> 4i) & 0x000f000f) | 0x43004300 is (128 + q, 128 + q') for codes i and i + 4, less
// 128 (exact in bf16) the codes themselves. Lane t's word t of a weight row's 32 columns holds
// codes 8t .. 8t + 7; its B fragments take (8t, 8t + 4), (8t + 1, 8t + 5) in the first k-step of
// the 32 and (8t + 2, 8t + 6), (8t + 3, 8t + 7) in the second, as the (low, high) halves of
// k = (2t, 2t + 1), (2t + 8, 2t + 9). So A is split in code order: position 16 h + k of each 32
// columns holds column
//   8 (k % 8 / 2) + 2 h + k / 8 + 4 (k % 2)      (SplitColumn),
// and the arithmetic is the kernel above's: acc += s (sum_k a q) + m (sum_k a) a k-tile.
constexpr int kPipeStages = 3;
constexpr int kSplitRowWords = 36;  // 32 + 4: ldmatrix's 8 rows a phase on distinct banks
constexpr int kCodeRowWords = 12;   // 8 + 4: a fragment load's 8 rows on distinct banks

__device__ __forceinline__ int SplitColumn(int p) {
  const int h = p / 16, k = p % 16;
  return 8 * (k % 8 / 2) + 2 * h + k / 8 + 4 * (k % 2);
}

// One warp a (row, 64 columns: a k-tile), kSplitRows rows at once (their loads in flight
// together), rows strided by the grid's y: lane p takes column SplitColumn(p) (code_order) or p of
// each 32. The k-tile's sum is its two 32s' warp sums added, the order the GEMMs added them in when
// they read a sum per 32 (two loads and an add a row a k-tile, ~24 instructions of the int4 wgmma
// kernel's ~250 a warp a k-tile at 64 rows; ncu, tests/bench/NOTES.md, stop 44).
constexpr int kSplitRows = 4;
__global__ void SplitForGemmKernel(const float* a, int64_t rows, int64_t lda, int64_t K,
                                   bool code_order, uint16_t* out) {
  WaitForPriorKernel();
  const int64_t chunk =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (chunk >= K / 64) return;
  const int lane = threadIdx.x % kWarp;
  const int column = code_order ? SplitColumn(lane) : lane;
  const int64_t stride = gridDim.y;
  for (int64_t row0 = blockIdx.y; row0 < rows; row0 += kSplitRows * stride) {
    float x[kSplitRows][2];
#pragma unroll
    for (int u = 0; u < kSplitRows; ++u) {
      const int64_t row = row0 + u * stride;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        x[u][h] = row < rows ? a[row * lda + chunk * 64 + 32 * h + column] : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kSplitRows; ++u) {
      const int64_t row = row0 + u * stride;
      if (row >= rows) break;  // warp-uniform
      float sum[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __nv_bfloat16 hi = __float2bfloat16_rn(x[u][h]);
        const __nv_bfloat16 lo = __float2bfloat16_rn(x[u][h] - __bfloat162float(hi));
        const int64_t at = row * K + chunk * 64 + 32 * h + lane;
        out[at] = __bfloat16_as_ushort(hi);
        out[rows * K + at] = __bfloat16_as_ushort(lo);
        sum[h] = WarpSum(__bfloat162float(hi) + __bfloat162float(lo));
      }
      if (lane == 0) {
        reinterpret_cast<float*>(out + 2 * rows * K)[row * (K / 64) + chunk] = sum[0] + sum[1];
      }
    }
  }
}

// The weight side of a stage, per format: Load (this thread's share of k-tile k0, by cp.async,
// or plain loads for a matrix at an odd address), B (the fragments of the warp's four n-tiles
// for 32 columns kc: b[j][2h], b[j][2h + 1] are b0, b1 of k-step h) and, for int4, the group's
// {s, m} and A's sums. Loader: weight row tid / 2, half tid % 2 of its k-tile.
struct Bf16Pipe {
  static constexpr bool kScaled = false;
  struct Weights {
    uint32_t w[kTileN][kSplitRowWords];  // bf16 pairs
  };
  __device__ __forceinline__ static void Load(Weights& st, const GemmParams& p, const uint8_t* w,
                                              int64_t n, int64_t k0, bool aligned, int tid) {
    const int row = tid / 2, half = tid % 2;
    const bool ok = n + row < p.N;
    const uint8_t* src = w + ((ok ? n + row : 0) * p.K + k0 + 32 * half) * 2;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t* dst = &st.w[row][16 * half + 4 * c];
      if (aligned) {
        CpAsync16(dst, src + 16 * c, ok);
      } else {
        uint32_t w4[4] = {0u, 0u, 0u, 0u};
        if (ok) LoadWordsBytewise(src + 16 * c, w4);
        *reinterpret_cast<uint4*>(dst) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
      }
    }
  }
  __device__ __forceinline__ static void B(const Weights& st, int wn, int kc, int lane,
                                           uint32_t (&b)[4][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {  // n-tiles 2 jp and 2 jp + 1: {n 0-7, 8-15} x {k 0-7, 8-15}
        const int n = wn + 16 * jp + (lane & 7) + ((lane >> 4) << 3);
        const int c = 16 * kc + 8 * h + ((lane >> 3) & 1) * 4;
        uint32_t r[4];
        LdMatrixX4(SharedAddress(&st.w[n][c]), r);
        b[2 * jp][2 * h] = r[0], b[2 * jp][2 * h + 1] = r[1];
        b[2 * jp + 1][2 * h] = r[2], b[2 * jp + 1][2 * h + 1] = r[3];
      }
    }
  }
  // The weights as wgmma's A (WgmmaGemmKernel): the fragments of weight rows wr .. wr + 15 for the
  // k-tile's four k-steps.
  __device__ __forceinline__ static void A(const Weights& st, int wr, int lane,
                                           uint32_t (&a)[4][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      LdMatrixX4(SharedAddress(&st.w[wr + (lane & 15)][8 * s + (lane >> 4) * 4]), a[s]);
    }
  }
};

struct Int4Pipe {
  static constexpr bool kScaled = true;
  struct Weights {
    uint32_t codes[kTileN][kCodeRowWords];  // the k-tile's 64 codes of each weight row
    uint32_t params[kTileN];                // fp16 {s, m} of the k-tile's group
  };
  __device__ __forceinline__ static void Load(Weights& st, const GemmParams& p, const uint8_t* w,
                                              int64_t n, int64_t k0, bool aligned, int tid) {
    const int group_shift = GroupShift(p);
    const int64_t row_bytes = p.K >> 1, groups = p.K >> group_shift;
    const int row = tid / 2, half = tid % 2;
    const bool ok = n + row < p.N;
    const uint8_t* codes = w + (ok ? n + row : 0) * row_bytes + (k0 >> 1) + 16 * half;
    const bool p_ok = tid < kTileN && n + tid < p.N;
    const uint8_t* params = w + (p.N * row_bytes + 15) / 16 * 16 +  // QuantParamsOffset
                            ((p_ok ? n + tid : 0) * groups + (k0 >> group_shift)) * 4;
    if (aligned) {
      CpAsync16(&st.codes[row][4 * half], codes, ok);
      if (tid < kTileN) CpAsyncSmall<4>(&st.params[tid], params, p_ok);
    } else {
      uint32_t w4[4] = {0u, 0u, 0u, 0u};
      if (ok) LoadWordsBytewise(codes, w4);
      *reinterpret_cast<uint4*>(&st.codes[row][4 * half]) = make_uint4(w4[0], w4[1], w4[2], w4[3]);
      if (tid < kTileN) st.params[tid] = p_ok ? LoadU32Bytes(params) : 0u;
    }
  }
  __device__ __forceinline__ static void B(const Weights& st, int wn, int kc, int lane,
                                           uint32_t (&b)[4][4]) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t w = st.codes[wn + 8 * j + g][4 * kc + t];
#pragma unroll
      for (int i = 0; i < 4; ++i) b[j][i] = CodePair(w, 4 * i);
    }
  }
  // As Bf16Pipe::A: k-step 2 kc + h takes the pairs B's k-step h of the 32 columns kc takes.
  __device__ __forceinline__ static void A(const Weights& st, int wr, int lane,
                                           uint32_t (&a)[4][4]) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {
      const uint32_t w0 = st.codes[wr + g][4 * kc + t], w1 = st.codes[wr + g + 8][4 * kc + t];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[2 * kc + h][0] = CodePair(w0, 8 * h), a[2 * kc + h][1] = CodePair(w1, 8 * h);
        a[2 * kc + h][2] = CodePair(w0, 8 * h + 4), a[2 * kc + h][3] = CodePair(w1, 8 * h + 4);
      }
    }
  }
};

// A pipelined GEMM block's share (grid as LaunchPipe's): its group, first row and weight row, and
// k-tiles [kt_begin, kt_begin + num_k); false where it has none (block-uniform).
struct PipeTile {
  GemmGroup grp;
  int64_t m0, n0, kt_begin;
  int num_k;
};
__device__ __forceinline__ bool PipeTileOf(const GemmParams& p, const GemmGroup& single,
                                           PipeTile& w) {
  const bool split = p.k_splits > 1 && p.groups == nullptr && p.routed_ids == nullptr;
  w.grp = GroupOf(p, single, split ? 0 : blockIdx.z);
  w.m0 = static_cast<int64_t>(blockIdx.y) * kTileM;
  w.n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  if (w.m0 >= w.grp.row_count) return false;
  const int64_t tiles = split ? CeilDiv(p.K / 64, p.k_splits) : p.K / 64;
  w.kt_begin = split ? blockIdx.z * tiles : 0;
  w.num_k = static_cast<int>(Min64(p.K / 64, w.kt_begin + tiles) - w.kt_begin);
  return w.num_k > 0;
}

template <typename Fmt>
struct PipeStage {
  uint32_t a_hi[kTileM][kSplitRowWords];  // bf16 pairs of the split A
  uint32_t a_lo[kTileM][kSplitRowWords];
  typename Fmt::Weights w;
  float sums[kTileM];  // int4: sum of hi + lo over the k-tile, per row
};

// Grid (ceil(N / kTileN), ceil(max_rows / kTileM), groups or k_splits) as GemmMmaKernel's;
// LaunchPipelinedGemm checks what it needs.
template <typename Fmt>
__global__ __launch_bounds__(kGemmThreads, 2) void PipelinedGemmKernel(const GemmParams p,
                                                                       const GemmGroup single) {
  WaitForPriorKernel();
  PipeTile work;
  if (!PipeTileOf(p, single, work)) return;  // block-uniform
  const GemmGroup& grp = work.grp;
  const int64_t m0 = work.m0, n0 = work.n0, kt_begin = work.kt_begin, K = p.K;
  const int num_k = work.num_k;
  extern __shared__ __align__(16) unsigned char pipe_smem[];
  auto* stages = reinterpret_cast<PipeStage<Fmt>*>(pipe_smem);

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t = lane % 4;
  const uint16_t* a_hi = p.a_split;
  const uint16_t* a_lo = p.a_split + p.a_split_rows * K;
  const float* a_sums = reinterpret_cast<const float*>(p.a_split + 2 * p.a_split_rows * K);
  auto a_row = [&](int m) -> int64_t {  // A's row of the tile's row m, -1 past the group
    if (m0 + m >= grp.row_count) return -1;
    const int64_t r = grp.row_begin + m0 + m;
    return p.a_rows != nullptr ? p.a_rows[r] : r;
  };
  // Loaders. A: row tid / 4, 16-byte chunks 2 (tid % 4) and + 1 of hi and lo. Sums (int4): row
  // tid - 128 (128 <= tid < 192).
  const int la = tid / 4, lc = 2 * (tid % 4);
  const int64_t ra = a_row(la);
  const int64_t rs =
      Fmt::kScaled && tid >= kTileN && tid < kTileN + kTileM ? a_row(tid - kTileN) : -1;
  const auto* wbase = static_cast<const uint8_t*>(grp.w);
  const bool aligned = (reinterpret_cast<uintptr_t>(wbase) & 15) == 0;  // block-uniform

  auto issue = [&](int i) {  // k-tile kt_begin + i into its stage; a group committed either way
    if (i < num_k) {
      PipeStage<Fmt>& st = stages[i % kPipeStages];
      const int64_t k0 = (kt_begin + i) * 64;
      const int64_t at = (ra >= 0 ? ra : 0) * K + k0;
#pragma unroll
      for (int c = lc; c < lc + 2; ++c) {
        CpAsync16(&st.a_hi[la][4 * c], a_hi + at + 8 * c, ra >= 0);
        CpAsync16(&st.a_lo[la][4 * c], a_lo + at + 8 * c, ra >= 0);
      }
      Fmt::Load(st.w, p, wbase, n0, k0, aligned, tid);
      if (Fmt::kScaled && tid >= kTileN && tid < kTileN + kTileM) {
        CpAsyncSmall<4>(&st.sums[tid - kTileN], a_sums + (rs >= 0 ? rs : 0) * (K / 64) + k0 / 64,
                        rs >= 0);
      }
    }
    CpAsyncCommit();
  };

  const int wm = 32 * (warp / 4), wn = 32 * (warp % 4);  // the warp's 32 x 32 of the block tile
  float acc[2][4][4] = {};
  float part[2][4][4];  // int4: sum_k a q over the k-tile, before s and m
#pragma unroll
  for (int i = 0; i < kPipeStages - 1; ++i) issue(i);
  for (int i = 0; i < num_k; ++i) {
    CpAsyncWait<kPipeStages - 2>();  // this thread's copies of k-tile i are in
    __syncthreads();                 // everyone's; and everyone is done with k-tile i - 1
    issue(i + kPipeStages - 1);      // into k-tile i - 1's stage
    const PipeStage<Fmt>& st = stages[i % kPipeStages];
    if constexpr (Fmt::kScaled) {
#pragma unroll
      for (int a = 0; a < 2; ++a) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) part[a][j][e] = 0.f;
        }
      }
    }
    float(&dst)[2][4][4] = Fmt::kScaled ? part : acc;
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {  // the k-tile's two 32 columns
      uint32_t b[4][4];
      Fmt::B(st.w, wn, kc, lane, b);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t ah[2][4], al[2][4];
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          const int r = wm + 16 * a + (lane & 15), c = 16 * kc + 8 * h + (lane >> 4) * 4;
          LdMatrixX4(SharedAddress(&st.a_hi[r][c]), ah[a]);
          LdMatrixX4(SharedAddress(&st.a_lo[r][c]), al[a]);
        }
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            MmaBf16(dst[a][j], ah[a][0], ah[a][1], ah[a][2], ah[a][3], b[j][2 * h],
                    b[j][2 * h + 1]);
            MmaBf16(dst[a][j], al[a][0], al[a][1], al[a][2], al[a][3], b[j][2 * h],
                    b[j][2 * h + 1]);
          }
        }
      }
    }
    if constexpr (Fmt::kScaled) {  // acc += s (sum a q) + m (sum a), per (row, weight row)
#pragma unroll
      for (int a = 0; a < 2; ++a) {
        const float s0 = st.sums[wm + 16 * a + g], s1 = st.sums[wm + 16 * a + g + 8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint2 pw = *reinterpret_cast<const uint2*>(&st.w.params[wn + 8 * j + 2 * t]);
          const float2 c0 = __half22float2(*reinterpret_cast<const __half2*>(&pw.x));
          const float2 c1 = __half22float2(*reinterpret_cast<const __half2*>(&pw.y));
          acc[a][j][0] = fmaf(c0.x, part[a][j][0], fmaf(c0.y, s0, acc[a][j][0]));
          acc[a][j][1] = fmaf(c1.x, part[a][j][1], fmaf(c1.y, s0, acc[a][j][1]));
          acc[a][j][2] = fmaf(c0.x, part[a][j][2], fmaf(c0.y, s1, acc[a][j][2]));
          acc[a][j][3] = fmaf(c1.x, part[a][j][3], fmaf(c1.y, s1, acc[a][j][3]));
        }
      }
    }
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int a = 0; a < 2; ++a) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + wm + 16 * a + g + 8 * h;
      if (m >= grp.row_count) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + wn + 8 * j + 2 * t;
        if (n < p.N) StoreC(p, grp.row_begin + m, n, acc[a][j][2 * h]);
        if (n + 1 < p.N) StoreC(p, grp.row_begin + m, n + 1, acc[a][j][2 * h + 1]);
      }
    }
  }
}

// kKernel (a pipelined GEMM) with kSmem bytes of dynamic shared memory: a block per tile of
// kTileM rows x kTileN weight rows, grid z the groups or the K slices.
template <auto kKernel, size_t kSmem>
void LaunchPipe(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  static const bool attr = [] {  // more than 48 KiB of dynamic shared memory
    MOE_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmem)));
    return true;
  }();
  (void)attr;
  const bool split = p.k_splits > 1 && !p.has_groups();
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kTileN)),
                  static_cast<unsigned>(CeilDiv(p.max_rows, kTileM)),
                  static_cast<unsigned>(split ? p.k_splits : p.num_groups));
  Launch(kKernel, grid, kGemmThreads, kSmem, stream, p, single);
}

// ---- The same GEMM on Hopper's wgmma (sm_90a) ---------------------------------------------------
// PipelinedGemmKernel's tiles, stages and loads, its arithmetic per k-tile, with the roles turned
// around: the weights are wgmma's A (M: the block's 128 weight rows, 64 a warpgroup, fragments
// from shared memory into registers as that kernel's B), A's rows its B (N: the tile's rows, hi and
// lo tiles straight from shared memory in the 128-byte-swizzle layout). A k-tile is 4 k-steps x
// (hi, lo) = 8 products m64nNk16 a warpgroup, issued at once and waited for before the int4 tile's
// s and m scale them in; two blocks an SM overlap one another's waits. N is what the tile's rows
// need (16, 32 or 64), so that an expert's last, partial tile costs what its rows cost.
template <typename Fmt>
struct alignas(1024) WgmmaStage {
  uint16_t x_hi[kTileM * 64];  // the k-tile of the split A's rows, swizzled (wgmma.cuh)
  uint16_t x_lo[kTileM * 64];
  typename Fmt::Weights w;
  alignas(8) float sums[kTileM];  // int4: sum of hi + lo over the k-tile, per row
};

#ifdef MOE_WGMMA
// The block's tile of C over k-tiles [kt_begin, kt_begin + num_k), on rows [0, NT) of the tile.
template <typename Fmt, int NT>
__device__ __forceinline__ void WgmmaGemmTile(const GemmParams& p, const GemmGroup& grp, int64_t m0,
                                              int64_t n0, int64_t kt_begin, int num_k,
                                              WgmmaStage<Fmt>* stages) {
  const int64_t K = p.K;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t = lane % 4;
  const uint16_t* a_hi = p.a_split;
  const uint16_t* a_lo = p.a_split + p.a_split_rows * K;
  const float* a_sums = reinterpret_cast<const float*>(p.a_split + 2 * p.a_split_rows * K);
  auto a_row = [&](int m) -> int64_t {  // A's row of the tile's row m, -1 past the group or NT
    if (m >= NT || m0 + m >= grp.row_count) return -1;
    const int64_t r = grp.row_begin + m0 + m;
    return p.a_rows != nullptr ? p.a_rows[r] : r;
  };
  // Loaders as PipelinedGemmKernel's; their rows' hi and sums, as pointers (registers are short).
  const int la = tid / 4, lc = 2 * (tid % 4);
  const int64_t ra = a_row(la);
  const int64_t rs =
      Fmt::kScaled && tid >= kTileN && tid < kTileN + kTileM ? a_row(tid - kTileN) : -1;
  const bool has_a = ra >= 0, has_s = rs >= 0;
  const uint16_t* x_row = a_hi + (has_a ? ra : 0) * K;
  const float* sum_row = a_sums + (has_s ? rs : 0) * (K / 64);
  const auto* wbase = static_cast<const uint8_t*>(grp.w);
  const bool aligned = (reinterpret_cast<uintptr_t>(wbase) & 15) == 0;  // block-uniform

  auto issue = [&](int i) {  // k-tile kt_begin + i into its stage; a group committed either way
    if (i < num_k) {
      WgmmaStage<Fmt>& st = stages[i % kPipeStages];
      const int64_t k0 = (kt_begin + i) * 64;
#pragma unroll
      for (int c = lc; c < lc + 2; ++c) {
        const int to = la * 64 + 8 * SwizzledChunk(la, c);
        CpAsync16(&st.x_hi[to], x_row + k0 + 8 * c, has_a);
        CpAsync16(&st.x_lo[to], x_row + (a_lo - a_hi) + k0 + 8 * c, has_a);
      }
      Fmt::Load(st.w, p, wbase, n0, k0, aligned, tid);
      if (Fmt::kScaled && tid >= kTileN && tid < kTileN + kTileM) {
        CpAsyncSmall<4>(&st.sums[tid - kTileN], sum_row + k0 / 64, has_s);
      }
    }
    CpAsyncCommit();
  };

  // This warp's 16 weight rows of the block's 128; D's element 4 j + e is weight row
  // wr + g + 8 (e / 2), tile row 8 j + 2 t + e % 2.
  const int wr = 64 * (warp / 4) + 16 * (warp % 4);
  float acc[NT / 2] = {};
  float part[NT / 2] = {};  // int4: sum_k a q over the k-tile, before s and m
#pragma unroll
  for (int i = 0; i < kPipeStages - 1; ++i) issue(i);
  for (int i = 0; i < num_k; ++i) {
    CpAsyncWait<kPipeStages - 2>();  // this thread's copies of k-tile i are in
    FenceProxyAsync();               // and visible to wgmma
    __syncthreads();                 // everyone's; and everyone is done with k-tile i - 1
    issue(i + kPipeStages - 1);      // into k-tile i - 1's stage
    const WgmmaStage<Fmt>& st = stages[i % kPipeStages];
    uint32_t a[4][4];
    Fmt::A(st.w, wr, lane, a);
    const uint64_t hi = SwizzledTile(st.x_hi), lo = SwizzledTile(st.x_lo);
    float(&dst)[NT / 2] = Fmt::kScaled ? part : acc;
    WgmmaFence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      WgmmaM64NK16(dst, a[s], hi + 2 * s, !Fmt::kScaled || s > 0);
      WgmmaM64NK16(dst, a[s], lo + 2 * s, true);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    KeepRegisters(dst);
#pragma unroll
    for (int s = 0; s < 4; ++s) KeepRegisters(a[s]);
    if constexpr (Fmt::kScaled) {  // acc += s (sum a q) + m (sum a), per (row, weight row)
      const float2 c0 = __half22float2(*reinterpret_cast<const __half2*>(&st.w.params[wr + g]));
      const float2 c1 = __half22float2(*reinterpret_cast<const __half2*>(&st.w.params[wr + g + 8]));
#pragma unroll
      for (int j = 0; j < NT / 8; ++j) {
        const float2 s01 = *reinterpret_cast<const float2*>(&st.sums[8 * j + 2 * t]);
        const float s0 = s01.x, s1 = s01.y;
        acc[4 * j] = fmaf(c0.x, part[4 * j], fmaf(c0.y, s0, acc[4 * j]));
        acc[4 * j + 1] = fmaf(c0.x, part[4 * j + 1], fmaf(c0.y, s1, acc[4 * j + 1]));
        acc[4 * j + 2] = fmaf(c1.x, part[4 * j + 2], fmaf(c1.y, s0, acc[4 * j + 2]));
        acc[4 * j + 3] = fmaf(c1.x, part[4 * j + 3], fmaf(c1.y, s1, acc[4 * j + 3]));
      }
    }
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t m = m0 + 8 * j + 2 * t + e % 2, n = n0 + wr + g + 8 * (e / 2);
      if (m < grp.row_count && n < p.N) StoreC(p, grp.row_begin + m, n, acc[4 * j + e]);
    }
  }
}
#endif  // MOE_WGMMA

template <typename Fmt>
__global__ __launch_bounds__(kGemmThreads, 2) void WgmmaGemmKernel(const GemmParams p,
                                                                   const GemmGroup single) {
#ifdef MOE_WGMMA
  WaitForPriorKernel();
  PipeTile w;
  if (!PipeTileOf(p, single, w)) return;  // block-uniform
  extern __shared__ __align__(16) unsigned char pipe_smem[];
  auto* stages = reinterpret_cast<WgmmaStage<Fmt>*>(
      pipe_smem + ((1024u - (SharedAddress(pipe_smem) & 1023u)) & 1023u));
  const int64_t rows = w.grp.row_count - w.m0;
  if (rows > 32) {
    WgmmaGemmTile<Fmt, 64>(p, w.grp, w.m0, w.n0, w.kt_begin, w.num_k, stages);
  } else if (rows > 16) {
    WgmmaGemmTile<Fmt, 32>(p, w.grp, w.m0, w.n0, w.kt_begin, w.num_k, stages);
  } else {
    WgmmaGemmTile<Fmt, 16>(p, w.grp, w.m0, w.n0, w.kt_begin, w.num_k, stages);
  }
#endif  // MOE_WGMMA
}

template <typename Fmt>
void LaunchPipelined(const GemmParams& p, const GemmGroup& single, bool wgmma,
                     cudaStream_t stream) {
  if (wgmma) {  // + 1024: the stages' alignment
    LaunchPipe<WgmmaGemmKernel<Fmt>, kPipeStages * sizeof(WgmmaStage<Fmt>) + 1024>(p, single,
                                                                                   stream);
  } else {
    LaunchPipe<PipelinedGemmKernel<Fmt>, kPipeStages * sizeof(PipeStage<Fmt>)>(p, single, stream);
  }
}

}  // namespace

bool LaunchGemmMma(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if (p.K % 32 != 0 || (reinterpret_cast<uintptr_t>(p.a) & 15) != 0 || p.lda % 4 != 0) {
    return false;
  }
  const bool split = p.k_splits > 1 && !p.has_groups();
  const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kTileN)),
                  static_cast<unsigned>(CeilDiv(p.max_rows, kTileM)),
                  static_cast<unsigned>(split ? p.k_splits : p.num_groups));
  auto launch = [&](auto kernel) { Launch(kernel, grid, kGemmThreads, 0, stream, p, single); };
  const bool wide = GemmKTile(p) == 64;
  switch (p.w_dtype) {
    case DType::kBF16:
      wide ? launch(GemmMmaKernel<Bf16Weights<32>, 64>)
           : launch(GemmMmaKernel<Bf16Weights<16>, 32>);
      return true;
    case DType::kQ8:
      wide ? launch(GemmMmaKernel<QuantWeights<8, 32>, 64>)
           : launch(GemmMmaKernel<QuantWeights<8, 16>, 32>);
      return true;
    case DType::kQ4:
      wide ? launch(GemmMmaKernel<QuantWeights<4, 32>, 64>)
           : launch(GemmMmaKernel<QuantWeights<4, 16>, 32>);
      return true;
    case DType::kQ2:
      wide ? launch(GemmMmaKernel<QuantWeights<2, 32>, 64>)
           : launch(GemmMmaKernel<QuantWeights<2, 16>, 32>);
      return true;
    case DType::kF8:
      wide ? launch(GemmMmaKernel<F8Weights<32>, 64>) : launch(GemmMmaKernel<F8Weights<16>, 32>);
      return true;
    default: return false;
  }
}

bool WgmmaGemm() {
  static const bool use = [] {
#ifdef MOE_CUDA_WGMMA
    const char* env = std::getenv("MOE_GEMM_WGMMA");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    int device = 0, major = 0, minor = 0;
    MOE_CUDA_CHECK(cudaGetDevice(&device));
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
#else
    return false;
#endif
  }();
  return use;
}

size_t SplitForGemmBytes(int64_t rows, int64_t K) {
  return static_cast<size_t>(rows) * static_cast<size_t>(K) * 4 +
         static_cast<size_t>(rows) * static_cast<size_t>(K / 64) * sizeof(float);
}

bool PipelinedGemmTakes(DType w_dtype, int64_t K, int32_t group_size) {
  return K % 64 == 0 &&
         (w_dtype == DType::kBF16 || (w_dtype == DType::kQ4 && group_size % 64 == 0));
}

void LaunchSplitForGemm(const float* a, int64_t rows, int64_t lda, int64_t K, DType w_dtype,
                        void* out, cudaStream_t stream) {
  MOE_CHECK(K % 64 == 0) << "SplitForGemm: K " << K << " is no multiple of 64";
  if (rows == 0) return;
  // Rows strided over the grid's y so that a warp takes about 8 of them: with a block a row, A's
  // splits held ~0.2 ms a layer of a 2,048-token prefill (ncu, stop 43) for ~220 MB moved.
  constexpr int kWarps = 8;
  const dim3 grid(static_cast<unsigned>(CeilDiv(K / 64, kWarps)),
                  static_cast<unsigned>(std::min<int64_t>(CeilDiv(rows, 2 * kSplitRows), 65535)));
  Launch(SplitForGemmKernel, grid, kWarps * kWarp, 0, stream, a, rows, lda, K,
         w_dtype == DType::kQ4, static_cast<uint16_t*>(out));
}

void LaunchPipelinedGemm(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  MOE_CHECK(p.a_split != nullptr && PipelinedGemmTakes(p.w_dtype, p.K, p.group_size) && !p.glu() &&
            (p.k_splits <= 1 || p.w_dtype == DType::kBF16))
      << "PipelinedGemm: a shape it does not take: " << DTypeName(p.w_dtype) << " K " << p.K
      << ", group " << p.group_size;
  if (p.w_dtype == DType::kQ4) {
    LaunchPipelined<Int4Pipe>(p, single, WgmmaGemm(), stream);
  } else {
    LaunchPipelined<Bf16Pipe>(p, single, WgmmaGemm(), stream);
  }
}

}  // namespace moe::kernels::cuda
