// Causal GQA attention over the contiguous cache on the GPU, flash-attention style (online
// softmax over key tiles in shared memory), split over keys for decode (flash-decoding).
//
// Legend: T tokens, NH query heads, NKV kv heads, G = NH / NKV, D head dim, S cached positions.
// A block takes 16 query rows of one kv head: row qi of [T * G] is token qi / G, head
// kvh * G + qi % G, so the G query heads sharing a kv head share every K/V tile it loads (decode:
// one block holds all G heads of the token). Grid (ceil(T*G / 16), NKV, splits); 4 warps, each
// owning 4 query rows; within a tile lane j scores key j, and each lane owns D/32 output columns.
// With splits > 1 every block writes an unnormalised partial (o, m, l), merged by a second kernel.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kQRows = 16, kRowsPerWarp = 4, kAttnThreads = 128, kKeys = 32;

struct AttnParams {
  AttentionArgs a;
  int group = 1;               // G
  int64_t keys_per_split = 0;  // multiple of kKeys
  int num_splits = 1;
  float* part_o = nullptr;   // [splits, T * NH, D]
  float* part_ml = nullptr;  // [splits, T * NH, 2]: running max m, denominator l
};

template <int DMAX>
size_t AttentionSmemBytes() {
  return sizeof(float) * (kQRows * DMAX + kKeys * (DMAX + 1) + kKeys * DMAX);
}

// Where K/V elements come from: the contiguous fp32 cache of AttentionArgs, or the paged,
// possibly fp8-compressed blocks (paged_attention.cuh). Load(s, kvh, d) returns K and V of
// position s, kv-head kvh, element d as fp32.
struct ContiguousKv {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t stride = 0;  // NKV * D
  int head_dim = 0;
  __device__ __forceinline__ void Load(int64_t s, int kvh, int d, float& kv, float& vv) const {
    kv = k[s * stride + kvh * head_dim + d];
    vv = v[s * stride + kvh * head_dim + d];
  }
};

template <int DMAX, typename Src>
__global__ __launch_bounds__(kAttnThreads) void AttentionKernel(const AttnParams p, const Src src) {
  constexpr int kCols = DMAX / kWarp;  // output columns per lane
  extern __shared__ float smem[];
  float* q_s = smem;                      // [16, DMAX]
  float* k_s = q_s + kQRows * DMAX;       // [32, DMAX + 1], padded: lane j reads row j
  float* v_s = k_s + kKeys * (DMAX + 1);  // [32, DMAX]
  const AttentionArgs& a = p.a;
  const int D = a.head_dim, G = p.group;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t rows_total = a.num_tokens * G;
  const int64_t qi0 = static_cast<int64_t>(blockIdx.x) * kQRows;

  for (int idx = threadIdx.x; idx < kQRows * DMAX; idx += blockDim.x) {
    const int r = idx / DMAX, d = idx % DMAX;
    const int64_t qi = qi0 + r;
    float v = 0.f;
    if (qi < rows_total && d < D) {
      const int64_t t = qi / G;
      const int h = kvh * G + static_cast<int>(qi % G);
      v = a.q[(t * a.num_heads + h) * D + d];
    }
    q_s[idx] = v;
  }

  // Keys any row of this block may see, cut to this split's share.
  const int64_t t_lo = qi0 / G;
  const int64_t t_hi = Min64(a.num_tokens - 1, (qi0 + kQRows - 1) / G);
  const int64_t first =
      a.sliding_window > 0 ? Max64(0, a.start_pos + t_lo - a.sliding_window + 1) : 0;
  const int64_t s_begin = Max64(first, split * p.keys_per_split);
  const int64_t s_end = Min64(a.start_pos + t_hi + 1, (split + 1) * p.keys_per_split);

  bool valid[kRowsPerWarp];
  int64_t pos[kRowsPerWarp], lo[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    valid[r] = qi < rows_total;
    pos[r] = a.start_pos + qi / G;
    lo[r] = a.sliding_window > 0 ? pos[r] - a.sliding_window + 1 : 0;
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) o[r][i] = 0.f;
  }

  for (int64_t s0 = s_begin; s0 < s_end; s0 += kKeys) {
    __syncthreads();  // q_s written / the previous tile consumed
    for (int idx = threadIdx.x; idx < kKeys * D; idx += blockDim.x) {
      const int j = idx / D, d = idx % D;
      const int64_t s = s0 + j;
      float kv = 0.f, vv = 0.f;
      if (s < s_end) src.Load(s, kvh, d, kv, vv);
      k_s[j * (DMAX + 1) + d] = kv;
      v_s[j * DMAX + d] = vv;
    }
    __syncthreads();

    float sc[kRowsPerWarp] = {};  // q[row] . k[s0 + lane]
    const float* kr = k_s + lane * (DMAX + 1);
    const float* qw = q_s + warp * kRowsPerWarp * DMAX;
    for (int d = 0; d < D; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) sc[r] = fmaf(qw[r * DMAX + d], kd, sc[r]);
    }
    const int64_t s = s0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool ok = valid[r] && s < s_end && s <= pos[r] && s >= lo[r];
      const float score = ok ? sc[r] * a.scale : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(score));
      if (m_new == -INFINITY) continue;  // warp-uniform: no visible key yet
      const float corr = expf(m[r] - m_new);
      const float pr = ok ? expf(score - m_new) : 0.f;
      l[r] = l[r] * corr + WarpSum(pr);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kCols; ++i) o[r][i] *= corr;
      for (int j = 0; j < kKeys; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
        if (pj == 0.f) continue;  // warp-uniform: masked key
#pragma unroll
        for (int i = 0; i < kCols; ++i) o[r][i] = fmaf(pj, v_s[j * DMAX + lane + i * kWarp], o[r][i]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (!valid[r]) continue;
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    const int64_t row = (qi / G) * a.num_heads + kvh * G + qi % G;  // t * NH + h
    if (p.num_splits == 1) {
      const float inv = 1.f / l[r];  // > 0: key pos[r] is always in range
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = lane + i * kWarp;
        if (d < D) a.out[row * D + d] = o[r][i] * inv;
      }
    } else {
      const int64_t prow = split * a.num_tokens * a.num_heads + row;
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = lane + i * kWarp;
        if (d < D) p.part_o[prow * D + d] = o[r][i];
      }
      if (lane == 0) {
        p.part_ml[prow * 2] = m[r];
        p.part_ml[prow * 2 + 1] = l[r];
      }
    }
  }
}

// out[row] = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z, M = max_z m_z; one block per row.
__global__ void AttentionCombineKernel(const AttnParams p) {
  const AttentionArgs& a = p.a;
  const int64_t row = blockIdx.x, rows = a.num_tokens * a.num_heads;
  float M = -INFINITY;
  for (int z = 0; z < p.num_splits; ++z) M = fmaxf(M, p.part_ml[(z * rows + row) * 2]);
  float den = 0.f;
  for (int z = 0; z < p.num_splits; ++z) {
    const float mz = p.part_ml[(z * rows + row) * 2];
    if (mz != -INFINITY) den += expf(mz - M) * p.part_ml[(z * rows + row) * 2 + 1];
  }
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float num = 0.f;
    for (int z = 0; z < p.num_splits; ++z) {
      const float mz = p.part_ml[(z * rows + row) * 2];
      if (mz != -INFINITY) num += expf(mz - M) * p.part_o[(z * rows + row) * a.head_dim + d];
    }
    a.out[row * a.head_dim + d] = num / den;
  }
}

template <int DMAX, typename Src>
void LaunchAttention(const AttnParams& p, const Src& src, dim3 grid, cudaStream_t stream) {
  const size_t smem = AttentionSmemBytes<DMAX>();
  if (smem > 48 * 1024) {
    MOE_CUDA_CHECK(cudaFuncSetAttribute(AttentionKernel<DMAX, Src>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  AttentionKernel<DMAX, Src><<<grid, kAttnThreads, smem, stream>>>(p, src);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// Plans the split, reserves partials through `reserve`, launches the flash kernel reading `src`
// and, when split, the combine kernel. Shared by Attention and PagedAttention.
template <typename Src, typename Reserve>
void RunAttention(const AttentionArgs& a, const Src& src, int num_sms, Reserve reserve,
                  cudaStream_t stream) {
  AttnParams p;
  p.a = a;
  p.group = a.num_heads / a.num_kv_heads;
  const int64_t tiles = CeilDiv(a.num_tokens * p.group, kQRows);
  const int64_t blocks = tiles * a.num_kv_heads;
  const int64_t keys = a.start_pos + a.num_tokens;  // S
  // Flash-decoding: when the grid would leave SMs idle, split the keys so that about two blocks
  // run per SM, each split at least 64 keys (two tiles).
  int64_t per_split = CeilDiv(keys, kKeys) * kKeys;
  if (blocks < 2 * num_sms && keys >= 128) {
    const int64_t want = std::min(CeilDiv(2 * num_sms, blocks), keys / 64);
    per_split = CeilDiv(CeilDiv(keys, want), kKeys) * kKeys;
  }
  p.keys_per_split = per_split;
  p.num_splits = static_cast<int>(CeilDiv(keys, per_split));
  MOE_CHECK(tiles <= 0x7fffffff && p.num_splits <= 65535)
      << "Attention: grid " << tiles << " x " << p.num_splits;
  if (p.num_splits > 1) {
    const size_t rows = static_cast<size_t>(a.num_tokens) * a.num_heads;
    const size_t floats = static_cast<size_t>(p.num_splits) * rows * (a.head_dim + 2);
    p.part_o = static_cast<float*>(reserve(floats * sizeof(float)));
    p.part_ml = p.part_o + static_cast<size_t>(p.num_splits) * rows * a.head_dim;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(p.num_splits));
  if (a.head_dim <= 64) {
    LaunchAttention<64>(p, src, grid, stream);
  } else if (a.head_dim <= 128) {
    LaunchAttention<128>(p, src, grid, stream);
  } else {
    LaunchAttention<256>(p, src, grid, stream);
  }
  if (p.num_splits > 1) {
    AttentionCombineKernel<<<static_cast<unsigned>(a.num_tokens * a.num_heads), 128, 0,
                             stream>>>(p);
    MOE_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::Attention(const AttentionArgs& a) {
  MOE_CHECK(a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0 && a.head_dim > 0 &&
            a.head_dim <= 256 && a.start_pos >= 0)
      << "Attention: heads " << a.num_heads << " kv heads " << a.num_kv_heads << " head_dim "
      << a.head_dim << " start_pos " << a.start_pos;
  if (a.num_tokens == 0) return;
  cuda::ContiguousKv src{a.k_cache, a.v_cache, static_cast<int64_t>(a.num_kv_heads) * a.head_dim,
                         a.head_dim};
  cuda::RunAttention(a, src, num_sms_, [this](size_t bytes) { return Reserve(work_, bytes); },
                     stream_);
}

}  // namespace moe::kernels

// ---- Paged KV cache: bf16 and fp8-e4m3 tiles (engine/kv_storage.h, kernels/kv_quant.h) --------
// Tile of (block b, kv-head h, role) at layer_base + b·block_stride + (2h + role)·tile_bytes;
// bf16: [bs][D] bf16; fp8: [bs][D] E4M3FN codes, then [bs] fp32 scales. TurboQuant formats keep
// the host-staged default of backend.cc.
namespace moe::kernels::cuda {
namespace {

// F32ToBf16 of tensor.h: round to nearest even on the bits, NaN kept quiet.
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// F32ToE4m3 of kernels/cpu/kv_quant.cc, step for step (finite input): RNE, saturating to 0x7e.
__device__ __forceinline__ uint8_t F32ToE4m3Bits(float f) {
  const uint8_t sign = signbit(f) ? 0x80 : 0x00;
  const float a = fabsf(f);
  if (a >= 448.f) return sign | 0x7e;
  if (a < 0x1.0p-6f) return sign | static_cast<uint8_t>(rintf(__fmul_rn(a, 0x1.0p9f)));
  int e;
  const float fr = frexpf(a, &e);
  int exponent = e - 1;
  int mantissa = static_cast<int>(rintf(__fmul_rn(__fsub_rn(__fmul_rn(2.f, fr), 1.f), 8.f)));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  const int code = min(((exponent + 7) << 3) | mantissa, 0x7e);
  return sign | static_cast<uint8_t>(code);
}

__device__ __forceinline__ float E4m3Value(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  float v;
  if (exponent == 0xf && mantissa == 0x7) {
    v = __int_as_float(0x7fc00000);
  } else if (exponent == 0) {
    v = ldexpf(static_cast<float>(mantissa), -9);
  } else {
    v = ldexpf(1.f + mantissa / 8.f, exponent - 7);
  }
  return (code & 0x80) ? -v : v;
}

__device__ __forceinline__ float LoadF32Bytes(const uint8_t* p) {  // any alignment
  return __uint_as_float(uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                         uint32_t{p[3]} << 24);
}

struct PagedGeom {
  uint8_t* base = nullptr;
  int64_t block_stride = 0, tile_bytes = 0;
  int block_size = 0, num_kv_heads = 0, head_dim = 0;
  const int32_t* table = nullptr;  // device copy of the block table
  __device__ __forceinline__ uint8_t* Tile(int64_t pos, int kvh, int role) const {
    return base + static_cast<int64_t>(table[pos / block_size]) * block_stride +
           (2 * kvh + role) * tile_bytes;
  }
};

// K/V source of AttentionKernel over paged tiles. fp8 elements come back as scale · E4M3(code)
// (the CPU multiplies the scale after the dot product: a different rounding, within fp32).
template <bool kFp8>
struct PagedKvSource {
  PagedGeom g;
  __device__ __forceinline__ float Element(const uint8_t* tile, int slot, int d) const {
    const int D = g.head_dim;
    if constexpr (kFp8) {
      const float s = LoadF32Bytes(tile + static_cast<int64_t>(g.block_size) * D + 4 * slot);
      return s * E4m3Value(tile[static_cast<int64_t>(slot) * D + d]);
    } else {
      const uint16_t h = reinterpret_cast<const uint16_t*>(tile)[static_cast<int64_t>(slot) * D + d];
      return __uint_as_float(uint32_t{h} << 16);
    }
  }
  __device__ __forceinline__ void Load(int64_t s, int kvh, int d, float& kv, float& vv) const {
    const int slot = static_cast<int>(s % g.block_size);
    const uint8_t* kt = g.Tile(s, kvh, 0);
    kv = Element(kt, slot, d);
    vv = Element(kt + g.tile_bytes, slot, d);
  }
};

// One block per (token, kv-head, role): checks finiteness, then bf16 bits or fp8 amax, scale and
// codes exactly as KvCodec::Quantize. A non-finite vector is not written; the smallest such
// (t·NKV + h)·2 + role goes to *bad.
template <bool kFp8>
__global__ void PagedKvWriteKernel(PagedGeom g, const float* k, const float* v, int64_t start_pos,
                                   unsigned* bad) {
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, D = g.head_dim;
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * D;
  bool finite = true;
  float amax = 0.f;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    finite = finite && isfinite(x[j]);
    amax = fmaxf(amax, fabsf(x[j]));
  }
  const bool all_finite = __syncthreads_and(finite);
  if (!all_finite) {
    if (threadIdx.x == 0) atomicMin(bad, static_cast<unsigned>((t * g.num_kv_heads + h) * 2 + role));
    return;
  }
  const int64_t pos = start_pos + t;
  const int slot = static_cast<int>(pos % g.block_size);
  uint8_t* tile = g.Tile(pos, h, role);
  if constexpr (kFp8) {
    __shared__ float warp_max[32];
    amax = WarpMax(amax);
    if (threadIdx.x % kWarp == 0) warp_max[threadIdx.x / kWarp] = amax;
    __syncthreads();
    amax = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarp); ++w) amax = fmaxf(amax, warp_max[w]);
    const float scale = __fdiv_rn(amax, 448.f);
    uint8_t* codes = tile + static_cast<int64_t>(slot) * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
      codes[j] = scale > 0.f ? F32ToE4m3Bits(__fdiv_rn(x[j], scale)) : 0;
    }
    if (threadIdx.x == 0) {
      uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * D + 4 * slot;
      const uint32_t bits = __float_as_uint(scale);
      for (int i = 0; i < 4; ++i) sp[i] = static_cast<uint8_t>(bits >> (8 * i));
    }
  } else {
    uint16_t* dst = reinterpret_cast<uint16_t*>(tile) + static_cast<int64_t>(slot) * D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) dst[j] = F32ToBf16Bits(x[j]);
  }
}

enum class PagedPath { kHost, kBf16, kFp8, kTq };

// What the GPU runs for this layer: every codec must share one format; TurboQuant only for the
// single-part MSE formats (tq1..tq4) with the RHT2 rotation. kHost: the host-staged default.
PagedPath ChoosePath(const PagedKvLayer& kv) {
  if (kv.head_dim <= 0 || kv.head_dim > 256 || kv.num_kv_heads <= 0) return PagedPath::kHost;
  const KvCodec& c0 = *kv.codecs[0];
  const KvFormat f = c0.format();
  for (int i = 0; i < 2 * kv.num_kv_heads; ++i) {
    const KvCodec& c = *kv.codecs[i];
    if (c.format() != f || c.head_dim() != kv.head_dim || c.norm() != c0.norm()) {
      return PagedPath::kHost;
    }
  }
  if (f == KvFormat::kBf16) return PagedPath::kBf16;
  if (f == KvFormat::kFp8E4m3) return PagedPath::kFp8;
  if (f != KvFormat::kTq4 && f != KvFormat::kTq3 && f != KvFormat::kTq2 && f != KvFormat::kTq1) {
    return PagedPath::kHost;
  }
  if (kv.head_dim < 32 || (kv.head_dim & (kv.head_dim - 1)) != 0) return PagedPath::kHost;
  for (int i = 0; i < 2 * kv.num_kv_heads; ++i) {
    const auto& parts = kv.codecs[i]->parts();
    if (parts.size() != 1 || parts[0].rotation.kind() != RotationKind::kRht2 ||
        parts[0].bits != c0.parts()[0].bits ||
        parts[0].codebook.centroids != c0.parts()[0].codebook.centroids ||
        parts[0].codebook.boundaries != c0.parts()[0].codebook.boundaries) {
      return PagedPath::kHost;
    }
  }
  return PagedPath::kTq;
}

// ---- TurboQuant (single part, RHT2): spec T9 -----------------------------------------------
// Device copy of what the codecs hold: signs [NKV][2 roles][D₁, D₂][D] as ±1, then the codebook
// (centroids [2^b], boundaries [2^b − 1]). Built on the host per call.
struct TqTables {
  const float* signs = nullptr;
  const float* centroids = nullptr;
  const float* boundaries = nullptr;
  int bits = 0;
  int norm = 0;         // TqNorm
  float alpha = 1.f;    // float(codebook.alpha()), the debiased divisor
  __device__ __forceinline__ const float* D1(int kvh, int role, int D) const {
    return signs + ((kvh * 2 + role) * 2) * D;
  }
  __device__ __forceinline__ const float* D2(int kvh, int role, int D) const {
    return signs + ((kvh * 2 + role) * 2 + 1) * D;
  }
};

// Fwht of kv_rotation.cc on y[n] in shared memory, blockDim.x >= n / 2: every butterfly is the
// same two roundings as on the CPU (the order of independent butterflies does not matter).
__device__ __forceinline__ void BlockFwht(float* y, int n) {
  for (int h = 1; h < n; h <<= 1) {
    __syncthreads();
    const int t = threadIdx.x;
    if (t < n / 2) {
      const int j = (t / h) * 2 * h + t % h;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b);
      y[j + h] = __fsub_rn(a, b);
    }
  }
  __syncthreads();
}

// y = Π x (forward = true) or x = Πᵀ y for the RHT2 rotation, in place on v[n] in shared memory,
// the CPU's arithmetic order (Rotation::Apply / ApplyTranspose).
__device__ __forceinline__ void BlockRht2(float* v, int n, const float* d1, const float* d2,
                                          bool forward) {
  const float inv_n = 1.f / static_cast<float>(n);
  if (forward) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(d1[i], v[i]);
    BlockFwht(v, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], d2[i]);
    BlockFwht(v, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], inv_n);
  } else {
    BlockFwht(v, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], d2[i]);
    BlockFwht(v, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], __fmul_rn(d1[i], inv_n));
  }
  __syncthreads();
}

// F32ToF16 of kernels/tensor.cc (round to nearest even, overflow to inf).
__device__ __forceinline__ uint16_t F32ToF16Bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = bits & 0x7fffffu;
  if (((bits >> 23) & 0xffu) == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  if (exp >= 0x1f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(half);
}

// KvCodec::Quantize for a single-part MSE format, one block per (token, kv-head, K|V), D threads:
// n = sqrt(Σ x_j² ascending) by one thread, u = x / n, y = Π u, idx = #boundaries <= y, scale,
// fp16 scale; indices packed b bits each, little-endian; scale plane after the index plane.
__global__ void TqWriteKernel(PagedGeom g, TqTables tb, const float* k, const float* v,
                              int64_t start_pos, unsigned* bad) {
  extern __shared__ float tq_smem[];
  const int D = g.head_dim, b = tb.bits;
  float* y = tq_smem;                                   // [D]
  uint8_t* idx = reinterpret_cast<uint8_t*>(y + D);     // [D]
  __shared__ float norm_s, scale_s;
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z;
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * D;
  bool finite = true;
  for (int j = threadIdx.x; j < D; j += blockDim.x) finite = finite && isfinite(x[j]);
  if (!__syncthreads_and(finite)) {
    if (threadIdx.x == 0) atomicMin(bad, static_cast<unsigned>((t * g.num_kv_heads + h) * 2 + role));
    return;
  }
  if (threadIdx.x == 0) {
    float n2 = 0.f;
    for (int j = 0; j < D; ++j) n2 = __fadd_rn(n2, __fmul_rn(x[j], x[j]));
    norm_s = __fsqrt_rn(n2);
  }
  __syncthreads();
  const float n = norm_s;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    y[j] = n == 0.f ? 0.f : __fdiv_rn(x[j], n);
  }
  if (n != 0.f) BlockRht2(y, D, tb.D1(h, role, D), tb.D2(h, role, D), true);
  const int levels = 1 << b;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    int c = 0;
    if (n != 0.f) {
      for (int i = 0; i < levels - 1; ++i) c += tb.boundaries[i] <= y[j] ? 1 : 0;
    }
    idx[j] = static_cast<uint8_t>(c);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    if (n != 0.f) {
      if (tb.norm == static_cast<int>(TqNorm::kPlain)) {
        s = n;
      } else if (tb.norm == static_cast<int>(TqNorm::kDebiased)) {
        s = __fdiv_rn(n, tb.alpha);
      } else {
        float e = 0.f;
        for (int j = 0; j < D; ++j) {
          const float c = tb.centroids[idx[j]];
          e = __fadd_rn(e, __fmul_rn(c, c));
        }
        s = e > 0.f ? __fdiv_rn(n, __fsqrt_rn(e)) : 0.f;
      }
    }
    scale_s = s;
  }
  __syncthreads();
  const float s = scale_s;
  if (!(s <= 65504.f)) {
    if (threadIdx.x == 0) atomicMin(bad, static_cast<unsigned>((t * g.num_kv_heads + h) * 2 + role));
    return;
  }
  const int64_t pos = start_pos + t;
  const int slot = static_cast<int>(pos % g.block_size);
  uint8_t* tile = g.Tile(pos, h, role);
  const int index_bytes = D * b / 8;
  uint8_t* plane = tile + static_cast<int64_t>(slot) * index_bytes;
  for (int byte = threadIdx.x; byte < index_bytes; byte += blockDim.x) {
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i) {
      const int bit = byte * 8 + i;
      out |= ((static_cast<uint32_t>(idx[bit / b]) >> (bit % b)) & 1u) << i;
    }
    plane[byte] = static_cast<uint8_t>(out);
  }
  if (threadIdx.x == 0) {
    const uint16_t hb = F32ToF16Bits(s);
    uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * index_bytes + 2 * slot;
    sp[0] = static_cast<uint8_t>(hb & 0xff);
    sp[1] = static_cast<uint8_t>(hb >> 8);
  }
}

// K/V source over TurboQuant tiles, in the rotated frame: element d of slot = s · C[idx_d].
struct TqKvSource {
  PagedGeom g;
  TqTables tb;
  __device__ __forceinline__ float Element(const uint8_t* tile, int slot, int d) const {
    const int b = tb.bits, index_bytes = g.head_dim * b / 8;
    const uint8_t* plane = tile + static_cast<int64_t>(slot) * index_bytes;
    const int bit = d * b;
    // An index spans at most two bytes (b <= 4... up to 8 within a 16-bit window).
    uint32_t w = plane[bit >> 3];
    if ((bit & 7) + b > 8) w |= static_cast<uint32_t>(plane[(bit >> 3) + 1]) << 8;
    const uint32_t c = (w >> (bit & 7)) & ((1u << b) - 1u);
    const uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * index_bytes + 2 * slot;
    const float s = __half2float(__ushort_as_half(static_cast<unsigned short>(sp[0] | sp[1] << 8)));
    return s * tb.centroids[c];
  }
  __device__ __forceinline__ void Load(int64_t s, int kvh, int d, float& kv, float& vv) const {
    const int slot = static_cast<int>(s % g.block_size);
    const uint8_t* kt = g.Tile(s, kvh, 0);
    kv = Element(kt, slot, d);
    vv = Element(kt + g.tile_bytes, slot, d);
  }
};

// q' = Π_K q (forward) before attention, out = Πᵀ_V acc after it; one block per (token, head).
__global__ void TqRotateKernel(float* dst, const float* src, TqTables tb, int num_heads, int group,
                               int D, bool forward) {
  extern __shared__ float tq_smem[];
  const int64_t row = blockIdx.x;  // t * NH + h
  const int h = static_cast<int>(row % num_heads), kvh = h / group;
  for (int i = threadIdx.x; i < D; i += blockDim.x) tq_smem[i] = src[row * D + i];
  __syncthreads();
  const int role = forward ? 0 : 1;
  BlockRht2(tq_smem, D, tb.D1(kvh, role, D), tb.D2(kvh, role, D), forward);
  for (int i = threadIdx.x; i < D; i += blockDim.x) dst[row * D + i] = tq_smem[i];
}

// Host side: the signs and codebook of the layer's codecs, laid out as TqTables reads them.
std::vector<float> TqHostTables(const PagedKvLayer& kv) {
  const int D = kv.head_dim;
  std::vector<float> host;
  host.reserve(4 * kv.num_kv_heads * D + 512);
  for (int i = 0; i < 2 * kv.num_kv_heads; ++i) {
    const Rotation& r = kv.codecs[i]->parts()[0].rotation;
    host.insert(host.end(), r.signs1().begin(), r.signs1().end());
    host.insert(host.end(), r.signs2().begin(), r.signs2().end());
  }
  const Codebook& cb = kv.codecs[0]->parts()[0].codebook;
  host.insert(host.end(), cb.centroids.begin(), cb.centroids.end());
  host.insert(host.end(), cb.boundaries.begin(), cb.boundaries.end());
  return host;
}

TqTables TqDeviceTables(const PagedKvLayer& kv, const float* dev) {
  const int D = kv.head_dim;
  const KvCodec::Part& part = kv.codecs[0]->parts()[0];
  TqTables tb;
  tb.signs = dev;
  tb.centroids = dev + 4 * kv.num_kv_heads * D;
  tb.boundaries = tb.centroids + part.codebook.centroids.size();
  tb.bits = part.bits;
  tb.norm = static_cast<int>(kv.codecs[0]->norm());
  tb.alpha = static_cast<float>(part.codebook.alpha());
  return tb;
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

absl::Status CudaBackend::PagedKvWrite(const PagedKvWriteArgs& a) {
  const cuda::PagedPath path = cuda::ChoosePath(a.kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedKvWrite(a);  // split/prod formats
  if (a.num_tokens == 0) return absl::OkStatus();
  const PagedKvLayer& kv = a.kv;
  const int64_t blocks = (a.start_pos + a.num_tokens + kv.block_size - 1) / kv.block_size;
  cuda::PagedGeom g{kv.layer_base, kv.block_stride, kv.tile_bytes, kv.block_size,
                    kv.num_kv_heads, kv.head_dim, nullptr};
  g.table = static_cast<const int32_t*>(
      StageHostArgs(args_, kv.block_table, static_cast<size_t>(blocks) * sizeof(int32_t)));
  auto* bad = static_cast<unsigned*>(Reserve(args2_, sizeof(unsigned)));
  MOE_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned), stream_));
  MOE_CHECK(a.num_tokens <= 0x7fffffff) << "PagedKvWrite: " << a.num_tokens << " tokens";
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(kv.num_kv_heads), 2);
  const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
  if (path == cuda::PagedPath::kFp8) {
    cuda::PagedKvWriteKernel<true><<<grid, threads, 0, stream_>>>(g, a.k, a.v, a.start_pos, bad);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::PagedKvWriteKernel<false><<<grid, threads, 0, stream_>>>(g, a.k, a.v, a.start_pos, bad);
  } else {
    const std::vector<float> host = cuda::TqHostTables(kv);
    const float* dev = static_cast<const float*>(
        StageHostArgs(paged_, host.data(), host.size() * sizeof(float)));
    const size_t smem = kv.head_dim * (sizeof(float) + 1);
    cuda::TqWriteKernel<<<grid, threads, smem, stream_>>>(g, cuda::TqDeviceTables(kv, dev), a.k,
                                                          a.v, a.start_pos, bad);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
  // The Status contract needs the verdict now: one 4-byte copy that waits for the stream.
  unsigned first_bad = 0;
  CopyToHost(&first_bad, bad, sizeof(first_bad));
  if (first_bad != 0xffffffffu) {
    const int64_t t = first_bad / 2 / kv.num_kv_heads;
    const int h = static_cast<int>(first_bad / 2 % kv.num_kv_heads);
    return absl::InvalidArgumentError(absl::StrCat(
        "KV write at position ", a.start_pos + t, ", kv-head ", h,
        first_bad % 2 == 0 ? " key: " : " value: ", "KV ", KvFormatName(kv.codecs[0]->format()),
        " quantization: the vector has a non-finite element or its scale exceeds the fp16 range "
        "(not written)"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::PagedAttention(const PagedAttentionArgs& a) {
  const cuda::PagedPath path = cuda::ChoosePath(a.kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedAttention(a);  // split/prod formats
  const PagedKvLayer& kv = a.kv;
  MOE_CHECK(a.num_heads % kv.num_kv_heads == 0 && a.start_pos >= 0)
      << "PagedAttention: heads " << a.num_heads << " kv heads " << kv.num_kv_heads
      << " start_pos " << a.start_pos;
  if (a.num_tokens == 0) return absl::OkStatus();
  const int64_t blocks = (a.start_pos + a.num_tokens + kv.block_size - 1) / kv.block_size;
  cuda::PagedGeom g{kv.layer_base, kv.block_stride, kv.tile_bytes, kv.block_size,
                    kv.num_kv_heads, kv.head_dim, nullptr};
  g.table = static_cast<const int32_t*>(
      StageHostArgs(args_, kv.block_table, static_cast<size_t>(blocks) * sizeof(int32_t)));
  AttentionArgs c;
  c.out = a.out;
  c.q = a.q;
  c.num_tokens = a.num_tokens;
  c.start_pos = a.start_pos;
  c.num_heads = a.num_heads;
  c.num_kv_heads = kv.num_kv_heads;
  c.head_dim = kv.head_dim;
  c.scale = a.scale;
  c.sliding_window = a.sliding_window;
  auto reserve = [this](size_t bytes) { return Reserve(work_, bytes); };
  if (path == cuda::PagedPath::kFp8) {
    cuda::RunAttention(c, cuda::PagedKvSource<true>{g}, num_sms_, reserve, stream_);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::RunAttention(c, cuda::PagedKvSource<false>{g}, num_sms_, reserve, stream_);
  } else {
    // Rotated frame: q' = Π_K q, attention over s · C[idx], out = Πᵀ_V acc.
    const std::vector<float> host = cuda::TqHostTables(kv);
    const size_t rows = static_cast<size_t>(a.num_tokens) * a.num_heads;
    const size_t n = rows * kv.head_dim;
    auto* dev = static_cast<float*>(Reserve(paged_, (host.size() + 2 * n) * sizeof(float)));
    MOE_CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_));
    float* q_rot = dev + host.size();
    float* o_rot = q_rot + n;
    const cuda::TqTables tb = cuda::TqDeviceTables(kv, dev);
    const int group = a.num_heads / kv.num_kv_heads;
    const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
    const size_t smem = kv.head_dim * sizeof(float);
    cuda::TqRotateKernel<<<static_cast<unsigned>(rows), threads, smem, stream_>>>(
        q_rot, a.q, tb, a.num_heads, group, kv.head_dim, true);
    MOE_CUDA_CHECK(cudaGetLastError());
    c.q = q_rot;
    c.out = o_rot;
    cuda::RunAttention(c, cuda::TqKvSource{g, tb}, num_sms_, reserve, stream_);
    cuda::TqRotateKernel<<<static_cast<unsigned>(rows), threads, smem, stream_>>>(
        a.out, o_rot, tb, a.num_heads, group, kv.head_dim, false);
    MOE_CUDA_CHECK(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
