// The grouped GEMM over group-wise quantized weights (kQ8/kQ4/kQ2/kF8, layout in kernels/quant.h):
// codes and fp16 {scale, offset} pairs are read straight from the quantized matrix and turned
// into floats in registers; no full-precision copy of a weight is ever made.
//
// Legend: M rows of A (tokens) per group, N weight rows, K reduction length, B bits per code,
// G quant group size (elements per scale/offset pair), s/m a group's scale/offset.
//
// Matrix-vector (<= kMatVecMaxRows rows of A, 8 per pass): per quant group g of a weight row,
//   sum_c x[c] (q[c] s + m) = s 2^B sum_c x[c] f[c] + (m - s 2^B) sum_c x[c],  f = 1 + q / 2^B
// f is made from the code with one shift and one and/or (its bits go straight into the mantissa
// of 1.0f), so a code costs 2 integer ops and 1 FMA; int->float conversions (a quarter-rate
// instruction) would cap int4 below HBM speed. int8 takes the code itself instead,
//   sum_c x[c] (q[c] s + m) = s sum_c x[c] q[c] + m sum_c x[c]   (as the CPU reference does)
// q exact in fp32 by one byte permute (0x4B0000qq = 2^23 + q) and one subtraction: the form
// above cancels sum x out of sum x f, which costs 2^B / |q| of fp32's precision, and for B = 8
// with the codes near 16 of asymmetric int4 loaded as int8 (published_quant.cc) that was up to
// 3.7x the 1e-4 golden bound (tests/bench/NOTES.md, "Exact codes"). A 32-bit word of codes lies in
// one quant group, so the sums above are taken per word: sum_c x[c] over the word's 8 (int4)
// values is computed once and shared by the warp's weight rows, and no per-group prologue or
// shared memory is needed. (The first version summed x per group into shared memory at the start of
// each block: a serial prologue that left the decode expert FFN at 41 us for 21 MB, H200,
// NOTES.md.) Each warp takes 4 weight rows, so that an x value loaded from L1 serves 4 (SwiGLU: 8)
// rows. Rows whose length in bytes is not a multiple of 16 (odd K) take a scalar path that
// dequantizes element by element.
// GEMM (prefill) where the tensor-core kernel (gemm_mma.cu) does not apply: the tiled SIMT kernel
// of matmul.cu with a loader that dequantizes each element.
// kF8 (fp8 e4m3 codes, an fp32 scale s per group) takes the int8 kernels with kF8 set: a word's 4
// codes become floats exactly (E4m3ToFloat: 2 integer ops and a multiply a code), summed against x
// per word, the word's sum times s: sum_c x[c] e4m3(q[c]) s.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/launch.cuh"

namespace moe::kernels::cuda {
namespace {

constexpr int kQWarps = 8;  // warps per block of the matrix-vector kernel

template <int B>
struct QFmt {
  static constexpr int kPerByte = 8 / B;
  static constexpr int kPerWord = 32 / B;        // codes in a 32-bit word
  static constexpr int kPerChunk = 4 * kPerWord;  // codes in a 16-byte load
  static constexpr uint32_t kMask = (1u << B) - 1;
  static constexpr float kScale = static_cast<float>(1 << B);
};

// 1 + q_i / 2^B as a float, q_i = bits [i B, (i + 1) B) of w: q_i is moved to the top B bits of
// the mantissa of 1.0f. i is a constant after unrolling, so the shift is one instruction.
template <int B>
__device__ __forceinline__ float OnePlusCode(uint32_t w, int i) {
  const int sh = 23 - B - i * B;
  const uint32_t s = sh >= 0 ? (w << sh) : (w >> -sh);
  return __uint_as_float((s & (QFmt<B>::kMask << (23 - B))) | 0x3f800000u);
}

// q_i = byte i of w as an exact float: the byte goes into the low mantissa bits of 2^23
// (0x4B0000qq = 2^23 + q_i), and 2^23 comes off exactly.
__device__ __forceinline__ float ByteCode(uint32_t w, int i) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + i)) - 8388608.f;
}

// Whether the matrix-vector kernels multiply x by the codes themselves (default: int8 on the SIMT
// kernel, int4 on the tensor cores) or by the codes plus an offset taken off after the sum
// (1 + q / 256, 128 + q): MOE_EXACT_CODES=0 keeps the latter (an A/B switch for measurements).
bool ExactCodes() {
  static const bool exact = [] {
    const char* env = std::getenv("MOE_EXACT_CODES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return exact;
}

// {s, m} of group g of a row, at any alignment (the scalar paths serve unaligned matrices too).
__device__ __forceinline__ float2 LoadParams(const uint8_t* params_row, int64_t g) {
  const uint8_t* b = params_row + 4 * g;
  __half_raw s, m;
  s.x = static_cast<unsigned short>(b[0] | b[1] << 8);
  m.x = static_cast<unsigned short>(b[2] | b[3] << 8);
  return make_float2(__half2float(__half(s)), __half2float(__half(m)));
}

// The fp32 scale of group g of a kF8 row, at any alignment.
__device__ __forceinline__ float LoadScale(const uint8_t* params_row, int64_t g) {
  return __uint_as_float(LoadU32Bytes(params_row + 4 * g));
}

// Code i of `byte` dequantized: q s + m.
template <int B>
__device__ __forceinline__ float WeightAt(uint32_t byte, int i, float2 sm) {
  return fmaf(static_cast<float>((byte >> (i * B)) & QFmt<B>::kMask), sm.x, sm.y);
}

struct QuantMatrix {
  const uint8_t* codes;   // this weight row's codes
  const uint8_t* params;  // this weight row's {s, m} pairs
};

__device__ __forceinline__ QuantMatrix RowOf(const void* w, int64_t n, int64_t N, int64_t row_bytes,
                                             int64_t groups) {
  const uint8_t* base = static_cast<const uint8_t*>(w);
  const int64_t params_off = (N * row_bytes + 15) / 16 * 16;  // QuantParamsOffset
  return {base + n * row_bytes, base + params_off + n * groups * 4};
}

// Block: kQWarps warps, each kRowsPerWarp consecutive weight rows (ws warps share a row set, each
// a 1/ws slice of K); grid (ceil(N * ws / (kQWarps * kRowsPerWarp)), groups).
// Lanes take consecutive 32-bit words of codes, so a warp's x loads cover one contiguous span
// (8 L1 wavefronts per 1 KB) and each x value loaded is used for kRowsPerWarp (x2 for SwiGLU)
// weight rows. (The first version gave each lane a 16-byte chunk: its x loads touched 32 lines
// per instruction and capped int4 at 10% of HBM bandwidth, H200, tests/bench/NOTES.md.)
constexpr int kRowsPerWarp = 4;

// kExact (int8 only): the codes themselves (ByteCode), s and m applied per word as on the CPU.
// kF8 (fp8 e4m3 codes, B = 8): each code's value (E4m3ToFloat), s per word, no offset.
template <int B, int TB, bool kGlu, int ws, bool kExact, bool kF8>
__global__ __launch_bounds__(kQWarps * kWarp) void QuantMatVecKernel(const GemmParams p,
                                                                    const GemmGroup single) {
  static_assert(!kExact || B == 8, "exact codes by byte permutes: int8 only");
  static_assert(!kF8 || B == 8, "fp8 codes are bytes");
  WaitForPriorKernel();
  using F = QFmt<B>;
  constexpr int NW = kGlu ? 2 : 1;        // gate and up matrices, or the one weight matrix
  constexpr int NR = NW * kRowsPerWarp;   // weight rows this warp dots with each x value
  __shared__ float partial[kQWarps][NR][TB];
  const GemmGroup g = GroupOf(p, single, blockIdx.y);
  if (g.row_count == 0) return;  // block-uniform
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int slice = warp % ws;
  const int t = slice * kWarp + lane;
  constexpr int kThreads = ws * kWarp;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * (kQWarps / ws) + warp / ws) * kRowsPerWarp;
  const int64_t K = p.K, G = p.group_size;
  const int64_t groups = CeilDiv(K, G);
  const int64_t row_bytes = (K * B + 7) / 8;
  QuantMatrix w[NR];  // [matrix][row]; rows past N alias row 0 (computed, never stored)
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t n = n0 + i < p.N ? n0 + i : 0;
    w[i] = RowOf(g.w, n, p.N, row_bytes, groups);
    if constexpr (kGlu) w[kRowsPerWarp + i] = RowOf(UpOf(p, blockIdx.y), n, p.N, row_bytes, groups);
  }
  bool vec = K % F::kPerChunk == 0 && (reinterpret_cast<uintptr_t>(g.w) & 15) == 0 &&
             (reinterpret_cast<uintptr_t>(p.a) & 15) == 0 && p.lda % 4 == 0;
  if constexpr (kGlu) vec = vec && (reinterpret_cast<uintptr_t>(UpOf(p, blockIdx.y)) & 15) == 0;

  for (int64_t m0 = 0; m0 < g.row_count; m0 += TB) {  // block-uniform trip count
    const int nt = static_cast<int>(Min64(TB, g.row_count - m0));
    const float* xr[TB];  // [TB][K]
#pragma unroll
    for (int j = 0; j < TB; ++j) {
      const int64_t r = g.row_begin + m0 + (j < nt ? j : 0);
      xr[j] = p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda;
    }
    float acc[NR][TB];
#pragma unroll
    for (int q = 0; q < NR; ++q) {
#pragma unroll
      for (int j = 0; j < TB; ++j) acc[q][j] = 0.f;
    }
    if (vec) {
      const int64_t words = row_bytes / 4;
      // G is a power of two (DispatchQuant checks): a shift, not a 64-bit division per word.
      const int g_shift = __ffs(static_cast<int>(G)) - 1;
      // kU words per row in flight per lane, loads issued before any math: with 4-byte loads,
      // fewer left int4 at 21% of HBM bandwidth (too few bytes in flight per SM, NOTES.md).
      constexpr int kU = kGlu ? 2 : 4;
      for (int64_t wd0 = t; wd0 < words; wd0 += static_cast<int64_t>(kThreads) * kU) {
        uint32_t code[kU][NR];
        float2 sm[kU][NR];  // {s 2^B, m} of the word's group ({s, m} when kExact)
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t wd = wd0 + static_cast<int64_t>(u) * kThreads;
          const int64_t gi = (wd * F::kPerWord) >> g_shift;  // a word lies in one group
#pragma unroll
          for (int q = 0; q < NR; ++q) {
            code[u][q] = wd < words ? __ldg(reinterpret_cast<const uint32_t*>(w[q].codes) + wd) : 0u;
            if constexpr (kF8) {  // {s, 0}: the fp32 scale
              sm[u][q] = make_float2(
                  wd < words ? __ldg(reinterpret_cast<const float*>(w[q].params) + gi) : 0.f, 0.f);
            } else {
              const float2 p2 =
                  wd < words
                      ? __half22float2(__ldg(reinterpret_cast<const __half2*>(w[q].params) + gi))
                      : make_float2(0.f, 0.f);
              sm[u][q] = make_float2(kExact ? p2.x : p2.x * F::kScale, p2.y);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t wd = wd0 + static_cast<int64_t>(u) * kThreads;
          if (wd >= words) break;
          const int64_t k0 = wd * F::kPerWord;
#pragma unroll
          for (int j = 0; j < TB; ++j) {
            const float4* x4 = reinterpret_cast<const float4*>(xr[j] + k0);
            float xv[F::kPerWord];
            float xs = 0.f;  // sum_c x[c] over the word, shared by the NR weight rows
#pragma unroll
            for (int v = 0; v < F::kPerWord / 4; ++v) {
              const float4 x = __ldg(x4 + v);
              xv[4 * v] = x.x;
              xv[4 * v + 1] = x.y;
              xv[4 * v + 2] = x.z;
              xv[4 * v + 3] = x.w;
              xs += (x.x + x.y) + (x.z + x.w);
            }
#pragma unroll
            for (int q = 0; q < NR; ++q) {
              float d = 0.f;
              if constexpr (kF8) {  // s sum_c x[c] e4m3(q[c])
#pragma unroll
                for (int e = 0; e < 4; ++e) d = fmaf(xv[e], E4m3ToFloat(code[u][q] >> (8 * e)), d);
                acc[q][j] = fmaf(sm[u][q].x, d, acc[q][j]);
              } else if constexpr (kExact) {
#pragma unroll
                for (int e = 0; e < F::kPerWord; ++e) d = fmaf(xv[e], ByteCode(code[u][q], e), d);
                // s sum x q + m sum x = sum x (q s + m)
                acc[q][j] = fmaf(sm[u][q].x, d, fmaf(sm[u][q].y, xs, acc[q][j]));
              } else {
#pragma unroll
                for (int e = 0; e < F::kPerWord; ++e) {
                  d = fmaf(xv[e], OnePlusCode<B>(code[u][q], e), d);
                }
                // s 2^B (sum x f - sum x) + m sum x = sum x (q s + m)
                acc[q][j] = fmaf(sm[u][q].x, d - xs, fmaf(sm[u][q].y, xs, acc[q][j]));
              }
            }
          }
        }
      }
    } else {  // odd K or unaligned: element by element, w = q s + m
      for (int64_t b = t; b < row_bytes; b += kThreads) {
#pragma unroll
        for (int q = 0; q < NR; ++q) {
          const uint32_t byte = w[q].codes[b];
#pragma unroll
          for (int i = 0; i < F::kPerByte; ++i) {
            const int64_t k = b * F::kPerByte + i;
            if (k >= K) break;
            const float wk = kF8 ? E4m3ToFloat(byte) * LoadScale(w[q].params, k / G)
                                 : WeightAt<B>(byte, i, LoadParams(w[q].params, k / G));
#pragma unroll
            for (int j = 0; j < TB; ++j) acc[q][j] = fmaf(wk, xr[j][k], acc[q][j]);
          }
        }
      }
    }
#pragma unroll
    for (int q = 0; q < NR; ++q) {
#pragma unroll
      for (int j = 0; j < TB; ++j) acc[q][j] = WarpSum(acc[q][j]);
    }
    if constexpr (ws > 1) {
      if (lane == 0) {
#pragma unroll
        for (int q = 0; q < NR; ++q) {
#pragma unroll
          for (int j = 0; j < TB; ++j) partial[warp][q][j] = acc[q][j];
        }
      }
      __syncthreads();
      if (slice == 0) {  // slices summed in a fixed order: deterministic
#pragma unroll
        for (int q = 0; q < NR; ++q) {
#pragma unroll
          for (int j = 0; j < TB; ++j) {
            for (int s2 = 1; s2 < ws; ++s2) acc[q][j] += partial[warp + s2][q][j];
          }
        }
      }
      __syncthreads();  // partial is reused by the next chunk of rows
    }
    if (slice == 0 && lane == 0) {
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        if (n0 + i >= p.N) break;
#pragma unroll
        for (int j = 0; j < TB; ++j) {
          float v = acc[i][j];
          if constexpr (kGlu) v = v / (1.f + expf(-v)) * acc[kRowsPerWarp + i][j];
          if (j < nt) StoreC(p, g.row_begin + m0 + j, n0 + i, v);
        }
      }
    }
  }
}

template <int B, int TB, bool kGlu, bool kExact, bool kF8>
void LaunchQuantMatVecRows(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  const dim3 block(kQWarps * kWarp);
  // K split over 4 warps when whole-row warps would give under 4 blocks per SM (the expert
  // gate/up, 768 rows x 8 experts: 192 blocks; the k/v projections; the router).
  constexpr int64_t kRowsPerBlock = kQWarps * kRowsPerWarp;
  const bool split = p.K >= 2048 && CeilDiv(p.N, kRowsPerBlock) * p.num_groups < 4 * p.num_sms;
  if (split) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N * 4, kRowsPerBlock)),
                    static_cast<unsigned>(p.num_groups));
    Launch(QuantMatVecKernel<B, TB, kGlu, 4, kExact, kF8>, grid, block, 0, stream, p, single);
  } else {
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kRowsPerBlock)),
                    static_cast<unsigned>(p.num_groups));
    Launch(QuantMatVecKernel<B, TB, kGlu, 1, kExact, kF8>, grid, block, 0, stream, p, single);
  }
}

// ---- int4 matrix-vector on the tensor cores (up to 8 rows of A) --------------------------------
// The SIMT kernel above spends ~3 instructions a code (shift, mask, FMA) and is bound by them
// (lm head: 67% of the SM's issue rate, 35% of HBM bandwidth, H200, NOTES.md). Here a warp takes
// 16 weight rows (the M of mma.m16n8k16) against up to 8 rows of A (the N: one token a column)
// and K in chunks of 64 codes, each inside one quant group (G >= 64). Lane (g, t) loads 8 bytes
// of rows g and g + 8 at byte 8t of the chunk: 16 codes each, two 32-bit words. A word's codes
// become bf16 without a conversion: (w >> s) & 0x000f000f | 0x43004300 puts codes s/4 and s/4 + 4
// into the low mantissa bits of 128.0 (exact: 128 + q), so 4 masks and 3 shifts make a word's 8
// codes. A mma's k runs over a lane's codes in the order the words give them (code i and i + 4 in
// one register), and x is laid out in the same order, so the dot product is unchanged:
//   sum_c x[c] (q[c] s + m) = s sum_c x[c] (128 + q[c]) + (m - 128 s) sum_c x[c]   (per chunk)
// x goes in as bf16 hi + lo (16 bits of mantissa, two products), made once per block into shared
// memory with each chunk's sum_c x[c] (of hi + lo: the values the products see).
// kExact (the default, ExactCodes): 128 comes off each bf16 pair before the products (one bf16x2
// subtraction, exact), so the sum is s sum_c x[c] q[c] + m sum_c x[c]: the fp32 sum of x (128 + q)
// rounds at 128 times the magnitude of x q's, which cost the g128 GPTQ golden fixture 2.6x its
// decode error and its batch-of-24 check a greedy flip (tests/bench/NOTES.md, "Exact codes").

// The bf16 pair of codes (w >> shift) & 0xf and (w >> (shift + 16)) & 0xf: (q, q') when kExact,
// else (128 + q, 128 + q').
template <bool kExact>
__device__ __forceinline__ uint32_t CodesAsBf16(uint32_t w, int shift) {
  return kExact ? CodePair(w, shift) : BiasedCodePair(w, shift);
}

// The kernel below for group `grp`, its matrices 8-byte aligned (kAligned: 8- and 4-byte loads)
// or not (byte loads), NT n-tiles of 8 rows of A (2: each weight fragment serves 16 tokens, so an
// expert with 9-16 tokens of a decode batch is read once, not twice), block bx of K split as
// Split says (MmaWarp::Make); x staged into shared memory first, or (stage false) already there
// from an earlier row-block of the same group (Int4MmaWalkKernel, K whole). partial:
// [kMmaWarps][NT * NW * 4][kWarp] floats when K is split.
template <bool kGlu, typename Split, bool kAligned, int NT, bool kExact>
__device__ __forceinline__ void Int4MmaMatVec(const GemmParams& p, const GemmGroup& grp,
                                              float* partial, int64_t bx, bool stage) {
  constexpr int NW = kGlu ? 2 : 1;  // gate and up matrices, or the one weight matrix
  // Chunks a round; two rounds in flight (registers). (Twice the chunks for two n-tiles, to keep
  // one block's 8 warps as many bytes in flight as two blocks have, was 9% slower at 256
  // sequences: H200, tests/bench/NOTES.md.)
  constexpr int kU = kGlu ? 2 : 4;
  extern __shared__ uint32_t xsmem[];
  const MmaWarp mw = MmaWarp::Make<Split>(p, grp, xsmem, bx);
  const int t = mw.t;
  const int64_t K = p.K;
  const int64_t row_bytes = K / 2, groups = K / p.group_size;
  const int g_shift = __ffs(static_cast<int>(p.group_size)) - 1;
  const uint8_t* codes[NW][2];
  const uint8_t* params[NW][2];
#pragma unroll
  for (int m = 0; m < NW; ++m) {
    const uint8_t* base = static_cast<const uint8_t*>(m == 0 ? grp.w : UpOf(p, blockIdx.y));
    const uint8_t* pbase = base + (p.N * row_bytes + 15) / 16 * 16;  // QuantParamsOffset
    codes[m][0] = base + mw.ra * row_bytes + 8 * t;
    codes[m][1] = base + mw.rb * row_bytes + 8 * t;
    params[m][0] = pbase + mw.ra * groups * 4;
    params[m][1] = pbase + mw.rb * groups * 4;
  }
  const int c_end = mw.c_end;

  // A round: kU chunks' codes and {s, m} (fp16 pairs) per matrix and row, loads issued together,
  // into buffer b (a compile-time index: registers). The next round's loads go out before this
  // round's products, so each warp keeps loads in flight while it computes.
  uint2 w[2][kU][NW][2];
  uint32_t sm[2][kU][NW][2];
  // Chunks past c_end are not loaded (nor computed). Addresses: the round's codes from one base
  // (constant offsets), the scales by a 32-bit index.
  auto load_round = [&](auto buffer, int c0) {
    constexpr int b = decltype(buffer)::value;
#pragma unroll
    for (int m = 0; m < NW; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* round_codes = codes[m][h] + c0 * 32;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int c = c0 + u;
          if (c >= c_end) continue;
          const uint8_t* q = round_codes + u * 32;
          const uint8_t* pm = params[m][h] + ((c * kMmaChunk) >> g_shift) * 4;
          if constexpr (kAligned) {
            w[b][u][m][h] = __ldg(reinterpret_cast<const uint2*>(q));
            sm[b][u][m][h] = __ldg(reinterpret_cast<const uint32_t*>(pm));
          } else {
            w[b][u][m][h] = make_uint2(LoadU32Bytes(q), LoadU32Bytes(q + 4));
            sm[b][u][m][h] = LoadU32Bytes(pm);
          }
        }
      }
    }
  };
  // The first round goes out before x is staged: the weights do not depend on the kernel before.
  load_round(std::integral_constant<int, 0>{}, mw.c_begin);

  if (stage) StageMmaX(p, grp, mw);

  float acc[NT][NW][4] = {};
  auto compute_round = [&](auto buffer, int c0) {
    constexpr int b = decltype(buffer)::value;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + u;
      if (c >= c_end) break;
#pragma unroll
      for (int x = 0; x < NT; ++x) {
        if (x > 0 && mw.nt <= kMmaTokens) break;  // block-uniform: a chunk of at most 8 rows
        uint32_t xw[16];
        mw.LoadX(c, xw, x);
        const float2 sx = *reinterpret_cast<const float2*>(mw.SumsOf(c) + kMmaTokens * x + 2 * t);
#pragma unroll
        for (int m = 0; m < NW; ++m) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint32_t wa = s < 2 ? w[b][u][m][0].x : w[b][u][m][0].y;
            const uint32_t wb = s < 2 ? w[b][u][m][1].x : w[b][u][m][1].y;
            const int sh = 8 * (s % 2);
            const uint32_t a0 = CodesAsBf16<kExact>(wa, sh), a1 = CodesAsBf16<kExact>(wb, sh);
            const uint32_t a2 = CodesAsBf16<kExact>(wa, sh + 4);
            const uint32_t a3 = CodesAsBf16<kExact>(wb, sh + 4);
            MmaBf16(d, a0, a1, a2, a3, xw[4 * s], xw[4 * s + 1]);
            MmaBf16(d, a0, a1, a2, a3, xw[4 * s + 2], xw[4 * s + 3]);
          }
          // d = (row g: columns 2t, 2t+1; row g + 8: the same); scale and offset per row.
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&sm[b][u][m][h]));
            const float off = kExact ? f.y : fmaf(-128.f, f.x, f.y);  // m, or m - 128 s
            acc[x][m][2 * h] = fmaf(f.x, d[2 * h], fmaf(off, sx.x, acc[x][m][2 * h]));
            acc[x][m][2 * h + 1] = fmaf(f.x, d[2 * h + 1], fmaf(off, sx.y, acc[x][m][2 * h + 1]));
          }
        }
      }
    }
  };
  MmaRounds<kU>(mw.c_begin, c_end, load_round, compute_round);
  MmaMatVecStore<kGlu, Split, NT>(p, grp, mw.n0, acc, partial);
}

// NT n-tiles: 1 (up to 8 rows of A, two blocks an SM) or 2 (9-16 rows: x of 16 rows at K = 2048
// is 140 KB, so one block an SM, and its registers are not capped at 128: MmaMatVecKernel's
// launch bounds).
template <int NT, bool kExact>
struct Int4Mma {
  static constexpr uintptr_t kAlign = 8;  // 8-byte code loads (the store aligns to 256 bytes)
  static constexpr size_t kMaxSmem = NT == 1 ? kMmaMaxSmem : 200 * 1024;
  static constexpr int kTiles = NT;
  static constexpr int kBits = 4;
  template <bool kGlu, typename Split, bool kAligned>
  __device__ __forceinline__ static void Body(const GemmParams& p, const GemmGroup& grp,
                                              float* partial) {
    Int4MmaMatVec<kGlu, Split, kAligned, NT, kExact>(p, grp, partial, blockIdx.x, true);
  }
};

// ---- blocks walking row-blocks -----------------------------------------------------------------
// At 9-16 rows of A each block stages x (16 rows x K fp32: 128 KB at K = 2048, gathered from L2)
// for 128 weight rows, 6 times an expert at the gate/up shape: 100 MB of staging a layer beside
// 214 MB of weights at 256 tokens, a serial prologue during which the SM's one block computes
// nothing (tests/bench/NOTES.md, stop 43). Here a block takes `per_block` consecutive row-blocks
// of its group and stages x once, where the kernel above would not split K: 3 row-blocks a block
// (Int4Walk) took 256 sequences from 6,845 to 7,021 tokens/s (H200, two interleaved rounds). The
// same for one n-tile (the planned groups of up to 8 rows: 12-64 sequences), where the groups'
// row-blocks also overfilled a wave: 64 sequences' gate/up ~780 blocks on 264 slots, three waves,
// x staged 6 times an expert; walking, gate/up 106 -> 102 us and down 65 -> 61 (stop 47). Two blocks an SM but for two n-tiles' gate/up (the
// down projection: x is 54 KB at K = 768, and the kernel above holds 127 registers; uncapped,
// this one took 135).
template <int NT, bool kGlu, bool kExact>
__global__ __launch_bounds__(kMmaThreads,
                             NT == 2 && kGlu ? 1 : 2) void Int4MmaWalkKernel(const GemmParams p,
                                                                             const GemmGroup single,
                                                                             int per_block) {
  WaitForPriorKernel();
  __shared__ float partial[1];  // K whole: unused
  const GemmGroup grp = GroupOf(p, single, blockIdx.y);
  if (grp.row_count == 0) return;  // block-uniform
  bool aligned = reinterpret_cast<uintptr_t>(grp.w) % Int4Mma<NT, kExact>::kAlign == 0;
  if constexpr (kGlu) {
    aligned = aligned &&
              reinterpret_cast<uintptr_t>(UpOf(p, blockIdx.y)) % Int4Mma<NT, kExact>::kAlign == 0;
  }
  const int64_t row_blocks = CeilDiv(p.N, int64_t{16} * kMmaWarps);
  for (int r = 0; r < per_block; ++r) {
    const int64_t bx = static_cast<int64_t>(blockIdx.x) * per_block + r;
    if (bx >= row_blocks) break;  // block-uniform
    // x stays in shared memory between row-blocks: nothing writes it after the first staging.
    if (aligned) {
      Int4MmaMatVec<kGlu, KWhole, true, NT, kExact>(p, grp, partial, bx, r == 0);
    } else {
      Int4MmaMatVec<kGlu, KWhole, false, NT, kExact>(p, grp, partial, bx, r == 0);
    }
  }
}

// Row-blocks a block of Int4MmaWalkKernel walks: 3, or MOE_INT4_WALK=R (0 or 1: the kernel is
// off; an A/B switch for measurements).
int Int4Walk() {
  static const int walk = [] {
    const char* env = std::getenv("MOE_INT4_WALK");
    return env == nullptr ? 3 : std::max(0, std::atoi(env));
  }();
  return walk;
}

template <int NT, bool kGlu>
void LaunchInt4MmaWalk(const GemmParams& p, const GemmGroup& single, size_t smem, int walk,
                       cudaStream_t stream) {
  static const bool attr = [] {  // once per instance: more than 48 KiB of dynamic shared memory
    MOE_CUDA_CHECK(cudaFuncSetAttribute(Int4MmaWalkKernel<NT, kGlu, true>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(Int4Mma<NT, true>::kMaxSmem)));
    return true;
  }();
  (void)attr;
  const int64_t row_blocks = CeilDiv(p.N, int64_t{16} * kMmaWarps);
  const dim3 grid(static_cast<unsigned>(CeilDiv(row_blocks, int64_t{walk})),
                  static_cast<unsigned>(p.num_groups));
  Launch(Int4MmaWalkKernel<NT, kGlu, true>, grid, kMmaThreads, smem, stream, p, single, walk);
}

// Blocks of MmaMatVecKernel<Fmt, kGlu, *> an SM holds with `smem` bytes of x (registers: asked
// once; shared memory: 228 KiB an SM, 1 KiB of it reserved per block).
template <typename Fmt, bool kGlu>
int64_t Int4MmaBlocksPerSm(size_t smem) {
  static const int by_registers = [] {
    int n = 0;
    MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, MmaMatVecKernel<Fmt, kGlu, 8>,
                                                                 kMmaWarps * kWarp, 0));
    return n > 0 ? n : 1;
  }();
  const size_t per_block =
      smem + sizeof(float) * kMmaWarps * Fmt::kTiles * (kGlu ? 8 : 4) * kWarp + 1024;
  return std::max<int64_t>(1, std::min<int64_t>(by_registers, 228 * 1024 / per_block));
}

template <typename Fmt>
void LaunchInt4MmaMatVecAs(const GemmParams& p, const GemmGroup& single, size_t smem,
                           cudaStream_t stream) {
  // K split over ws warps while the blocks still fit one wave: more loads in flight, and no
  // second wave repeating the staging of x.
  const int64_t per_sm =
      p.glu() ? Int4MmaBlocksPerSm<Fmt, true>(smem) : Int4MmaBlocksPerSm<Fmt, false>(smem);
  LaunchMmaMatVec<Fmt>(p, single, smem, p.num_sms * per_sm, stream);
}

// The tensor-core path takes int4 with chunks inside groups, whole chunks, aligned rows, up to 16
// rows of A and shared memory for them; false when it does not apply.
bool LaunchInt4MmaMatVec(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  const int64_t chunks = p.K / kMmaChunk;
  const size_t smem = MmaSmemBytes(p.max_rows, chunks);
  const bool two_tiles = p.max_rows > kMmaTokens;
  if (p.K % kMmaChunk != 0 || p.group_size < kMmaChunk || p.max_rows > kMmaTokens * kMmaMaxTiles ||
      smem > (two_tiles ? Int4Mma<2, true>::kMaxSmem : Int4Mma<1, true>::kMaxSmem) ||
      (reinterpret_cast<uintptr_t>(p.a) & 15) != 0 || p.lda % 4 != 0) {
    return false;
  }
  if (ExactCodes() && Int4Walk() > 1 && p.max_rows > 1) {
    // Where LaunchMmaMatVec would keep K whole (ws 1): the walk kernel has no K split. Not for
    // groups of one row (routed pairs): their x is a row, nothing to stage again, and walking
    // leaves fewer blocks than a wave holds.
    const int64_t tiles = CeilDiv(p.N, 16) * p.num_groups;
    const int64_t per_sm = two_tiles
                               ? (p.glu() ? Int4MmaBlocksPerSm<Int4Mma<2, true>, true>(smem)
                                          : Int4MmaBlocksPerSm<Int4Mma<2, true>, false>(smem))
                               : (p.glu() ? Int4MmaBlocksPerSm<Int4Mma<1, true>, true>(smem)
                                          : Int4MmaBlocksPerSm<Int4Mma<1, true>, false>(smem));
    if (CeilDiv(tiles * 2, kMmaWarps) > p.num_sms * per_sm || chunks < 8) {
      const int walk = Int4Walk();
      if (two_tiles) {
        p.glu() ? LaunchInt4MmaWalk<2, true>(p, single, smem, walk, stream)
                : LaunchInt4MmaWalk<2, false>(p, single, smem, walk, stream);
      } else {
        p.glu() ? LaunchInt4MmaWalk<1, true>(p, single, smem, walk, stream)
                : LaunchInt4MmaWalk<1, false>(p, single, smem, walk, stream);
      }
      return true;
    }
  }
  if (ExactCodes()) {
    two_tiles ? LaunchInt4MmaMatVecAs<Int4Mma<2, true>>(p, single, smem, stream)
              : LaunchInt4MmaMatVecAs<Int4Mma<1, true>>(p, single, smem, stream);
  } else {
    two_tiles ? LaunchInt4MmaMatVecAs<Int4Mma<2, false>>(p, single, smem, stream)
              : LaunchInt4MmaMatVecAs<Int4Mma<1, false>>(p, single, smem, stream);
  }
  return true;
}

template <int B, bool kGlu, bool kExact, bool kF8>
void LaunchQuantMatVecAs(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if (p.max_rows <= 1) {
    LaunchQuantMatVecRows<B, 1, kGlu, kExact, kF8>(p, single, stream);
  } else if (p.max_rows <= 2) {
    LaunchQuantMatVecRows<B, 2, kGlu, kExact, kF8>(p, single, stream);
  } else if (p.max_rows <= 4) {
    LaunchQuantMatVecRows<B, 4, kGlu, kExact, kF8>(p, single, stream);
  } else {
    LaunchQuantMatVecRows<B, 8, kGlu, kExact, kF8>(p, single, stream);
  }
}

template <int B, bool kGlu, bool kF8>
void LaunchQuantMatVec(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if constexpr (kF8) {  // codes are their values: nothing to make exact
    LaunchQuantMatVecAs<B, kGlu, false, true>(p, single, stream);
  } else {
    if constexpr (B == 4) {
      if (LaunchInt4MmaMatVec(p, single, stream)) return;
    }
    if constexpr (B == 8) {
      if (ExactCodes()) return LaunchQuantMatVecAs<B, kGlu, true, false>(p, single, stream);
    }
    LaunchQuantMatVecAs<B, kGlu, false, false>(p, single, stream);
  }
}

// ---- tiled GEMM: 64x64 output tile per block, 4x4 per thread, K in steps of 16 (the shapes -----
// `GemmMmaKernel` does not take: K not a multiple of 32, unaligned A)

template <int B, bool kF8>
__global__ __launch_bounds__(kTileThreads) void QuantGemmTiledKernel(const GemmParams p,
                                                                     const GemmGroup single) {
  WaitForPriorKernel();
  using F = QFmt<B>;
  const GemmGroup g = GroupOf(p, single, blockIdx.z);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  if (m0 >= g.row_count) return;
  __shared__ __align__(16) ATile As;  // A tile transposed
  __shared__ __align__(16) WTile Ws;  // W tile transposed, dequantized

  const int tid = threadIdx.x;
  const int lr = tid / 4, lk = (tid % 4) * 4;  // loader: row lr of the tile, k lk..lk+3
  const int64_t m = m0 + lr, n = n0 + lr;
  const float* arow = nullptr;
  if (m < g.row_count) {
    const int64_t r = g.row_begin + m;
    arow = p.a + (p.a_rows != nullptr ? p.a_rows[r] : r) * p.lda;
  }
  const int64_t K = p.K, G = p.group_size;
  const int64_t groups = CeilDiv(K, G), row_bytes = (K * B + 7) / 8;
  const QuantMatrix wrow = RowOf(g.w, n < p.N ? n : 0, p.N, row_bytes, groups);

  const int ty = tid / 16, tx = tid % 16;  // this thread's 4x4 outputs
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t k = k0 + lk + i;
      As[lk + i][lr] = arow != nullptr && k < K ? arow[k] : 0.f;
      float wk = 0.f;
      if (n < p.N && k < K) {
        const uint32_t byte = wrow.codes[k / F::kPerByte];
        wk = kF8 ? E4m3ToFloat(byte) * LoadScale(wrow.params, k / G)
                 : WeightAt<B>(byte, static_cast<int>(k % F::kPerByte),
                               LoadParams(wrow.params, k / G));
      }
      Ws[lk + i][lr] = wk;
    }
    __syncthreads();
    TileFma(As, Ws, tx, ty, acc);
    __syncthreads();
  }
  StoreTile(p, g, m0, n0, tx, ty, acc);
}

template <int B, bool kF8 = false>
void LaunchQuant(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  if (p.glu()) {
    LaunchQuantMatVec<B, true, kF8>(p, single, stream);
  } else if (p.max_rows <= kMatVecMaxRows) {
    LaunchQuantMatVec<B, false, kF8>(p, single, stream);
  } else if (p.a_split != nullptr) {
    LaunchPipelinedGemm(p, single, stream);
  } else if (!LaunchGemmMma(p, single, stream)) {
    const dim3 grid(static_cast<unsigned>(CeilDiv(p.N, kBN)),
                    static_cast<unsigned>(CeilDiv(p.max_rows, kBM)),
                    static_cast<unsigned>(p.num_groups));
    Launch(QuantGemmTiledKernel<B, kF8>, grid, kTileThreads, 0, stream, p, single);
  }
}

}  // namespace

void DispatchQuant(const GemmParams& p, const GemmGroup& single, cudaStream_t stream) {
  MOE_CHECK(p.group_size >= 32 && (p.group_size & (p.group_size - 1)) == 0)
      << "GroupedGemm: quantized " << DTypeName(p.w_dtype) << " needs a group size that is a "
      << "power of two >= 32 (quant.h: 32, 64, 128, 256), got " << p.group_size;
  switch (p.w_dtype) {
    case DType::kQ8: return LaunchQuant<8>(p, single, stream);
    case DType::kQ4: return LaunchQuant<4>(p, single, stream);
    case DType::kQ2: return LaunchQuant<2>(p, single, stream);
    case DType::kF8: return LaunchQuant<8, true>(p, single, stream);
    default: MOE_CHECK(false) << "GroupedGemm: " << DTypeName(p.w_dtype) << " is not quantized";
  }
}

}  // namespace moe::kernels::cuda
