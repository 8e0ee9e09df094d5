// The paged KV tiles on the device, shared by paged_kv_write.cu and paged_attention.cu: byte
// conversions, tile addresses (PagedGeom), the path a layer takes (ChoosePath), TurboQuant's
// tables and rotations for one part and for the split formats.
//
// ---- Paged KV cache tiles (engine/kv_storage.h, kernels/kvcodec/kv_quant.h) --------------------
// Tile of (block b, kv-head h, role) at layer_base + b·block_stride + (2h + role)·tile_bytes;
// bf16: [bs][D] bf16; fp8: [bs][D] E4M3FN codes, then [bs] fp32 scales; TurboQuant: the codec's
// planes. The prod formats keep the host-staged default of backend.cc (ChoosePath).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

// F32ToBf16 of tensor.h: round to nearest even on the bits, NaN kept quiet.
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// F32ToE4m3 of kernels/kvcodec/kv_quant.cc, step for step (finite input): RNE, saturating to 0x7e.
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

__device__ __forceinline__ float E4m3Value(uint8_t code) {  // exact, by the bits
  const uint32_t exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  float v;
  if (exponent == 0xf && mantissa == 0x7) {
    v = __int_as_float(0x7fc00000);
  } else if (exponent == 0) {
    v = static_cast<float>(mantissa) * 0x1p-9f;  // subnormal: m 2^-9
  } else {
    v = __uint_as_float((exponent + 120) << 23 | mantissa << 20);  // (1 + m/8) 2^(e - 7)
  }
  return (code & 0x80) ? -v : v;
}

__device__ __forceinline__ float LoadF16Bytes(const uint8_t* p) {  // any alignment
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | p[1] << 8)));
}

// Index j of a plane of b-bit indices (bit offset b · j, little-endian; b <= 8, so an index
// spans at most two bytes).
__device__ __forceinline__ uint32_t IndexAt(const uint8_t* plane, int j, int b) {
  const int bit = j * b;
  uint32_t w = plane[bit >> 3];
  if ((bit & 7) + b > 8) w |= static_cast<uint32_t>(plane[(bit >> 3) + 1]) << 8;
  return (w >> (bit & 7)) & ((1u << b) - 1u);
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
  // The tile of the sequence's block `index` (its block table's entry).
  __device__ __forceinline__ const uint8_t* TileOfBlock(int32_t index, int kvh, int role) const {
    return base + static_cast<int64_t>(table[index]) * block_stride + (2 * kvh + role) * tile_bytes;
  }
  // The tile holding cache slot `flat` = block · block_size + slot (the write kernels' address).
  __device__ __forceinline__ uint8_t* TileOfSlot(int32_t flat, int kvh, int role) const {
    return base + static_cast<int64_t>(flat / block_size) * block_stride +
           (2 * kvh + role) * tile_bytes;
  }
  __device__ __forceinline__ PagedGeom ForTable(int32_t offset) const {
    PagedGeom r = *this;
    r.table += offset;
    return r;
  }
  // Pool, blocks and tiles all start on multiples of `bytes` (a power of two).
  __host__ __device__ __forceinline__ bool AlignedTo(int bytes) const {
    const uint64_t any = reinterpret_cast<uintptr_t>(base) | static_cast<uint64_t>(block_stride) |
                         static_cast<uint64_t>(tile_bytes);
    return (any & static_cast<uint64_t>(bytes - 1)) == 0;
  }
};

enum class PagedPath { kHost, kBf16, kFp8, kTq, kTqSplit };

// The split formats' vectors: 32 outlier channels and 96 others (kv_quant.h).
constexpr int kSplitD = 128, kSplitO = 32, kSplitR = 96;
bool IsSplit(KvFormat f) { return f == KvFormat::kTq3p5 || f == KvFormat::kTq2p5; }

// What the GPU runs for this layer: every codec must share one format; TurboQuant for the MSE
// formats (tq1..tq4, and tq2.5/tq3.5 at head_dim 128) with the default RHT2 rotation. kHost: the
// host-staged default (the prod formats, other rotations).
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
  if (IsSplit(f)) {
    if (kv.head_dim != kSplitD) return PagedPath::kHost;
    const auto& parts0 = c0.parts();
    for (int i = 0; i < 2 * kv.num_kv_heads; ++i) {
      const auto& parts = kv.codecs[i]->parts();
      if (parts.size() != 2 || parts[0].channels.size() != kSplitO ||
          parts[0].rotation.kind() != RotationKind::kRht2 ||
          parts[1].rotation.kind() != RotationKind::kHaar) {
        return PagedPath::kHost;
      }
      for (int j = 0; j < 2; ++j) {
        if (parts[j].bits != parts0[j].bits ||
            parts[j].codebook.centroids != parts0[j].codebook.centroids ||
            parts[j].codebook.boundaries != parts0[j].codebook.boundaries) {
          return PagedPath::kHost;
        }
      }
    }
    return PagedPath::kTqSplit;
  }
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

// Fwht of kv_rotation.cc on y[n] in shared memory (n a power of two), by the whole block: every
// butterfly is the same two roundings as on the CPU (the order of independent butterflies does
// not matter).
__device__ __forceinline__ void BlockFwht(float* y, int n) {
  const int half = n / 2;
  for (int h = 1, log_h = 0; h < n; h <<= 1, ++log_h) {
    __syncthreads();
    for (int t = threadIdx.x; t < half; t += blockDim.x) {
      const int j = ((t >> log_h) << (log_h + 1)) + (t & (h - 1));
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

// BlockRht2 of one vector by one warp, with no barrier, on registers: lane holds elements
// x[k] = v[lane + 32k] and their signs d1[k], d2[k]; butterflies across lanes by shuffles, across
// k in registers. The same roundings as BlockRht2 (each butterfly is a + b and a - b of the same
// pair).
template <int D>
__device__ __forceinline__ void WarpRht2(float (&x)[D / kWarp], const float (&d1)[D / kWarp],
                                         const float (&d2)[D / kWarp], bool forward) {
  constexpr int kPer = D / kWarp;
  static_assert(D % kWarp == 0 && (D & (D - 1)) == 0);
  const int lane = threadIdx.x % kWarp;
  auto fwht = [&] {
#pragma unroll
    for (int h = 1; h < kWarp; h <<= 1) {
      const bool upper = lane & h;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const float other = __shfl_xor_sync(0xffffffffu, x[k], h);
        x[k] = upper ? __fsub_rn(other, x[k]) : __fadd_rn(x[k], other);
      }
    }
#pragma unroll
    for (int hk = 1; hk < kPer; hk <<= 1) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (k & hk) continue;
        const float a = x[k], b = x[k + hk];
        x[k] = __fadd_rn(a, b);
        x[k + hk] = __fsub_rn(a, b);
      }
    }
  };
  const float inv_n = 1.f / static_cast<float>(D);
  if (forward) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(d1[k], x[k]);
    fwht();
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(x[k], d2[k]);
    fwht();
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(x[k], inv_n);
  } else {
    fwht();
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(x[k], d2[k]);
    fwht();
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __fmul_rn(x[k], __fmul_rn(d1[k], inv_n));
  }
}

// The same on row[D] in shared memory, the signs from d1[D], d2[D].
template <int D>
__device__ __forceinline__ void WarpRht2(float* row, const float* d1, const float* d2,
                                         bool forward) {
  constexpr int kPer = D / kWarp;
  const int lane = threadIdx.x % kWarp;
  float x[kPer], s1[kPer], s2[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    x[k] = row[lane + kWarp * k], s1[k] = d1[lane + kWarp * k], s2[k] = d2[lane + kWarp * k];
  }
  WarpRht2<D>(x, s1, s2, forward);
#pragma unroll
  for (int k = 0; k < kPer; ++k) row[lane + kWarp * k] = x[k];
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

// ---- TurboQuant split formats (tq2.5, tq3.5; head_dim 128) ---------------------------------
// Two parts per vector (kv_quant.h): the 32 outlier channels at kBitsO bits under an RHT2 of
// dimension 32, the other 96 at kBitsR bits under a dense Haar rotation of dimension 96, each with
// its own codebook and fp16 scale. The rotated frame puts the outlier part at positions 0..31 and
// the rest at 32..127, as KvCodec::PrepareQuery does. Everything here repeats the CPU's
// arithmetic order (sums of squares and dense products ascending, no FMA), so codes and scales
// come out bit for bit (T9).
// Device copy of a layer's split codecs (laid out by TqSplitHostTables).
struct TqSplitTables {
  const float* perm = nullptr;    // [NKV][2 roles][128]: rotated position -> channel (exact ints)
  const float* signs = nullptr;   // [NKV][2][D₁, D₂][32]: the outlier part's RHT2
  const float* haar = nullptr;    // [NKV][2][96 · 96]: Π_R, row-major
  const float* haar_t = nullptr;  // [NKV][2][96 · 96]: Π_Rᵀ, row-major (coalesced forward products)
  const float* centroids_o = nullptr;
  const float* boundaries_o = nullptr;
  const float* centroids_r = nullptr;
  const float* boundaries_r = nullptr;
  int norm = 0;  // TqNorm
  float alpha_o = 1.f, alpha_r = 1.f;
  __device__ __forceinline__ int Codec(int kvh, int role) const { return kvh * 2 + role; }
  __device__ __forceinline__ int Channel(int kvh, int role, int pos) const {
    return static_cast<int>(perm[Codec(kvh, role) * kSplitD + pos]);
  }
  __device__ __forceinline__ const float* D1(int kvh, int role) const {
    return signs + Codec(kvh, role) * 2 * kSplitO;
  }
  __device__ __forceinline__ const float* D2(int kvh, int role) const {
    return D1(kvh, role) + kSplitO;
  }
  __device__ __forceinline__ const float* Haar(int kvh, int role) const {
    return haar + Codec(kvh, role) * kSplitR * kSplitR;
  }
  __device__ __forceinline__ const float* HaarT(int kvh, int role) const {
    return haar_t + Codec(kvh, role) * kSplitR * kSplitR;
  }
};

// Byte offsets in a tile of `tokens` slots: the outlier indices, the rest's, then the fp16 scales
// s_O and s_R (structure of arrays, kv_quant.h).
template <int kBitsO, int kBitsR>
struct SplitPlanes {
  static constexpr int kBytesO = kSplitO * kBitsO / 8, kBytesR = kSplitR * kBitsR / 8;
  __host__ __device__ static int64_t IndexO(int tokens, int slot) {
    return static_cast<int64_t>(slot) * kBytesO;
  }
  __host__ __device__ static int64_t IndexR(int tokens, int slot) {
    return static_cast<int64_t>(tokens) * kBytesO + static_cast<int64_t>(slot) * kBytesR;
  }
  __host__ __device__ static int64_t ScaleO(int tokens, int slot) {
    return static_cast<int64_t>(tokens) * (kBytesO + kBytesR) + 2 * slot;
  }
  __host__ __device__ static int64_t ScaleR(int tokens, int slot) {
    return static_cast<int64_t>(tokens) * (kBytesO + kBytesR + 2) + 2 * slot;
  }
};

// A 96 x 96 matrix into shared memory by asynchronous 16-byte copies, all in flight at once
// (read where the products need it, or staged by a loop of load-store pairs, each load was a
// round trip to memory: ~10 us a kernel). The caller syncs before use.
constexpr size_t kSplitMatrixBytes = sizeof(float) * kSplitR * kSplitR;
__device__ __forceinline__ void StageSplitMatrix(float* dst, const float* src) {
  for (int i = threadIdx.x; i < kSplitR * kSplitR / 4; i += blockDim.x) {
    const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(dst + 4 * i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to),
                 "l"(__cvta_generic_to_global(src + 4 * i)));
  }
  asm volatile("cp.async.wait_all;\n" ::);
}

// y[32 + i] = Σ_j m[j · 96 + i] · u[32 + j] for the thread's i = threadIdx.x − 32 (threads 32..127),
// j ascending, no FMA: with m = Π_Rᵀ this is Rotation::Apply, with m = Π_R ApplyTranspose.
__device__ __forceinline__ float SplitRestProduct(const float* m, const float* u) {
  const int i = threadIdx.x - kSplitO;
  float acc = 0.f;
#pragma unroll 8
  for (int j = 0; j < kSplitR; ++j) acc = __fadd_rn(acc, __fmul_rn(m[j * kSplitR + i], u[kSplitO + j]));
  return acc;
}

// The outlier part's RHT2 signs D₁, D₂ of codec (kvh, role) at position threadIdx.x (the first
// warp's; zero for the others): loaded ahead, where their latency overlaps other work.
struct SplitSigns {
  float d1 = 0.f, d2 = 0.f;
};
__device__ __forceinline__ SplitSigns LoadSplitSigns(const TqSplitTables& tb, int kvh, int role) {
  const int p = threadIdx.x;
  return p < kSplitO ? SplitSigns{tb.D1(kvh, role)[p], tb.D2(kvh, role)[p]} : SplitSigns{};
}

// Rotated position p = threadIdx.x (of 128) of [Π_O u_O, Π_R u_R] (forward; m = Π_Rᵀ) or of
// [Π_Oᵀ u_O, Π_Rᵀ u_R] (m = Π_R), u and m in shared memory, with the codec's signs.
__device__ __forceinline__ float SplitRotatePosition(const float* m, const float* u,
                                                     SplitSigns signs, bool forward) {
  const int p = threadIdx.x;
  if (p >= kSplitO) return SplitRestProduct(m, u);
  float r[1] = {u[p]}, d1[1] = {signs.d1}, d2[1] = {signs.d2};
  WarpRht2<kSplitO>(r, d1, d2, forward);  // the first warp: p < 32
  return r[0];
}

// Host side of TqSplitTables: perm, signs, Π_R and Π_Rᵀ of every codec in that order (each block
// codec by codec, kv-head major, K before V), then the outlier codebook (centroids, boundaries)
// and the rest's.
std::vector<float> TqSplitHostTables(const PagedKvLayer& kv) {
  const int n = 2 * kv.num_kv_heads;
  std::vector<float> host;
  for (int i = 0; i < n; ++i) {
    for (const KvCodec::Part& part : kv.codecs[i]->parts()) {
      for (int c : part.channels) host.push_back(static_cast<float>(c));
    }
  }
  for (int i = 0; i < n; ++i) {
    const Rotation& r = kv.codecs[i]->parts()[0].rotation;
    host.insert(host.end(), r.signs1().begin(), r.signs1().end());
    host.insert(host.end(), r.signs2().begin(), r.signs2().end());
  }
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& m = kv.codecs[i]->parts()[1].rotation.matrix();
    host.insert(host.end(), m.begin(), m.end());
  }
  for (int i = 0; i < n; ++i) {
    const std::vector<float>& m = kv.codecs[i]->parts()[1].rotation.matrix();
    for (int col = 0; col < kSplitR; ++col) {
      for (int row = 0; row < kSplitR; ++row) host.push_back(m[row * kSplitR + col]);
    }
  }
  for (const KvCodec::Part& part : kv.codecs[0]->parts()) {
    host.insert(host.end(), part.codebook.centroids.begin(), part.codebook.centroids.end());
    host.insert(host.end(), part.codebook.boundaries.begin(), part.codebook.boundaries.end());
  }
  return host;
}

TqSplitTables TqSplitDeviceTables(const PagedKvLayer& kv, const float* dev) {
  const int n = 2 * kv.num_kv_heads;
  const auto& parts = kv.codecs[0]->parts();
  TqSplitTables tb;
  tb.perm = dev;
  tb.signs = tb.perm + n * kSplitD;
  tb.haar = tb.signs + n * 2 * kSplitO;
  tb.haar_t = tb.haar + n * kSplitR * kSplitR;
  tb.centroids_o = tb.haar_t + n * kSplitR * kSplitR;
  tb.boundaries_o = tb.centroids_o + parts[0].codebook.centroids.size();
  tb.centroids_r = tb.boundaries_o + parts[0].codebook.boundaries.size();
  tb.boundaries_r = tb.centroids_r + parts[1].codebook.centroids.size();
  tb.norm = static_cast<int>(kv.codecs[0]->norm());
  tb.alpha_o = static_cast<float>(parts[0].codebook.alpha());
  tb.alpha_r = static_cast<float>(parts[1].codebook.alpha());
  return tb;
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {
namespace {

// True when two elements of a batch read the same layer of the same cache (OneLaunch).
bool SameLayer(const PagedKvLayer& a, const PagedKvLayer& b) {
  return b.layer_base == a.layer_base && b.block_stride == a.block_stride &&
         b.tile_bytes == a.tile_bytes && b.block_size == a.block_size && b.codecs == a.codecs &&
         b.num_kv_heads == a.num_kv_heads && b.head_dim == a.head_dim;
}

// Elements of T from `base` to `p` (device addresses, not necessarily one allocation): the tail
// kernels address each sequence's ring by its offset from the first one, which is the same in
// every layer (the rings sit at one offset in each sequence's state), so that the tables of
// offsets are staged once a step.
template <typename T>
int64_t ElementOffset(const T* base, const T* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) - reinterpret_cast<uintptr_t>(base)) /
         static_cast<int64_t>(sizeof(T));
}

}  // namespace
}  // namespace moe::kernels
