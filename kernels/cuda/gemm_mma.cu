// The grouped GEMM on the tensor cores (prefill, and decode groups past kMatVecMaxRows rows):
// C = A Wᵀ for bf16 and quantized (kQ8/kQ4/kQ2/kF8) weights, by mma.sync m16n8k16 (bf16 operands,
// fp32 accumulation). fp32 and fp16 weights, K not a multiple of 32 and A rows not 16-byte
// aligned keep the SIMT tiled kernels (matmul.cu, matmul_quant.cu).
//
// Precision: A is fp32; it enters as bf16 hi + lo (hi + lo = a to ~2^-16 relative), two products
// per step. bf16 weights are exact operands. A quantized weight w = q s + m (s, m per group of
// the row) enters as its code q, exact in bf16 for q < 256; each k-tile (32 or 64 wide) lies in one
// group, so its products sum_k a q are scaled once per tile: acc += s (sum_k a q) + m (sum_k a).
// k-tiles of 64 halve the barriers and the per-tile s/m scalings a product: the prefill's int4
// expert GEMMs went 830 -> 667 us a launch (H200); bf16 GEMMs, prefill or decode, did not move
// (tests/bench/NOTES.md, stop 40). 32 where K or the quant group does not allow 64.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/launch.cuh"

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
    const int64_t row_bytes = p.K * B / 8, groups = CeilDiv(p.K, p.group_size);
    const uint8_t* base = static_cast<const uint8_t*>(w);
    const uint8_t* codes = base + n * row_bytes + k * B / 8;
    const uint8_t* params = base + (p.N * row_bytes + 15) / 16 * 16 +  // QuantParamsOffset
                            (n * groups + k / p.group_size) * 4;
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
    const uint8_t* params = static_cast<const uint8_t*>(w) + (p.N * p.K + 15) / 16 * 16 +
                            (n * CeilDiv(p.K, p.group_size) + k / p.group_size) * 4;
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
  __shared__ __align__(16) uint32_t a_hi[kTileM][kRow];
  __shared__ __align__(16) uint32_t a_lo[kTileM][kRow];
  __shared__ __align__(16) uint32_t w_s[kTileN][kRow];
  __shared__ float a_sum[kTileM];   // quantized: sum_k (a_hi + a_lo) over the k-tile, per row
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
    uint32_t hi[kA / 2], lo[kA / 2];
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kA / 4; ++i) {
      SplitBf16x2(xa[i].x, xa[i].y, hi[2 * i], lo[2 * i], sum);
      SplitBf16x2(xa[i].z, xa[i].w, hi[2 * i + 1], lo[2 * i + 1], sum);
    }
#pragma unroll
    for (int i = 0; i < kA / 8; ++i) {
      *reinterpret_cast<uint4*>(&a_hi[la][lka / 2 + 4 * i]) =
          make_uint4(hi[4 * i], hi[4 * i + 1], hi[4 * i + 2], hi[4 * i + 3]);
      *reinterpret_cast<uint4*>(&a_lo[la][lka / 2 + 4 * i]) =
          make_uint4(lo[4 * i], lo[4 * i + 1], lo[4 * i + 2], lo[4 * i + 3]);
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
      uint32_t ah[2][4], al[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = wm + 16 * i + g;
        ah[i][0] = a_hi[r][c], ah[i][1] = a_hi[r + 8][c];
        ah[i][2] = a_hi[r][c + 4], ah[i][3] = a_hi[r + 8][c + 4];
        al[i][0] = a_lo[r][c], al[i][1] = a_lo[r + 8][c];
        al[i][2] = a_lo[r][c + 4], al[i][3] = a_lo[r + 8][c + 4];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = wn + 8 * j + g;
        b[j][0] = w_s[n][c], b[j][1] = w_s[n][c + 4];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          MmaBf16(dst[i][j], ah[i][0], ah[i][1], ah[i][2], ah[i][3], b[j][0], b[j][1]);
          MmaBf16(dst[i][j], al[i][0], al[i][1], al[i][2], al[i][3], b[j][0], b[j][1]);
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

}  // namespace moe::kernels::cuda
