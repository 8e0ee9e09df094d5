// PagedAttention on the GPU: the K/V sources over paged tiles (PagedKvSource for bf16 and fp8,
// TqKvSource and TqSplitKvSource for TurboQuant, in the rotated frame, with the rotation and
// combine kernels of those formats), read by the tensor-core decode kernel where the shape fits
// it (decode_attention.cuh) and by the SIMT flash kernel otherwise (attention_common.cuh).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/base/status.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/paged_kv.cuh"
#include "kernels/cuda/prefill_attention.cuh"

namespace moe::kernels::cuda {
namespace {

// K/V source of AttentionKernel over paged tiles. fp8 elements come back as scale · E4M3(code)
// (the CPU multiplies the scale after the dot product: a different rounding, within fp32).
// Load and LoadChunk of a paged source (AttentionKernel's K/V interface) from its per-tile
// Element and Chunk: position s is slot s % block_size of its block's K tile, V right after.
template <typename Source>
struct PagedLoads {
  __device__ __forceinline__ void Load(int64_t s, int kvh, int d, float& kv, float& vv) const {
    const Source& src = static_cast<const Source&>(*this);
    const int slot = static_cast<int>(s % src.g.block_size);
    const uint8_t* kt = src.g.Tile(s, kvh, 0);
    kv = src.Element(kt, slot, d);
    vv = src.Element(kt + src.g.tile_bytes, slot, d);
  }
  __device__ __forceinline__ void LoadChunk(int64_t s, int kvh, int d0, float (&kv)[kChunk],
                                            float (&vv)[kChunk]) const {
    const Source& src = static_cast<const Source&>(*this);
    const int slot = static_cast<int>(s % src.g.block_size);
    const uint8_t* kt = src.g.Tile(s, kvh, 0);
    src.Chunk(kt, slot, d0, kv);
    src.Chunk(kt + src.g.tile_bytes, slot, d0, vv);
  }
  __device__ __forceinline__ Source ForSeq(int32_t table_offset) const {
    Source r = static_cast<const Source&>(*this);
    r.g = r.g.ForTable(table_offset);
    return r;
  }
  // The decode kernel's loads (up to 16 bytes, LoadBytes) aligned.
  __host__ __device__ __forceinline__ bool DecodeAligned() const {
    return static_cast<const Source&>(*this).g.AlignedTo(16);
  }
  // DecodeAttentionKernel's layout of a vector, overridden by the split formats' source: the
  // first rotated dim of lane t's key chunk i and the part it is in, the part of value m-tiles 2w
  // and 2w + 1, and the dim of m-tile j's row g (half 0) or g + 8. (Sources name their number of
  // parts, the scales a vector has, as kParts.)
  template <int D>
  __host__ __device__ static constexpr int KeyChunkDim(int t, int i) {
    return 8 * (t * (D / 32) + i);
  }
  __host__ __device__ static constexpr int KeyChunkPart(int) { return 0; }
  __host__ __device__ static constexpr int ValuePart(int) { return 0; }
  template <int D>
  __host__ __device__ static constexpr int ValueDim(int g, int j, int half) {
    return g * (D / 8) + half * (D / 16) + j;
  }
};

template <bool kFp8>
struct PagedKvSource : PagedLoads<PagedKvSource<kFp8>> {
  PagedGeom g;
  __device__ __forceinline__ void Prepare() const {}
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
  // Every chunk's load aligned (bf16: 16 bytes, fp8: 8 bytes; head_dim a multiple of 8).
  __host__ __device__ __forceinline__ bool ChunksAligned() const {
    return g.AlignedTo(kFp8 ? 8 : 16);
  }
  // DecodeAttentionKernel's interface: raw chunks of 8 elements (ChunkPtr, SplitChunks), elements
  // 2p and 2p + 1 of a chunk as a bf16 pair (Bf16Pair; exact for both formats: no low half), the
  // Vᵀ operands (ValueOperands) and the vector's scale.
  static constexpr bool kLowHalf = false;
  static constexpr bool kCombineRotates = false;  // see TqSplitKvSource
  using Raw = std::conditional_t<kFp8, uint2, uint4>;
  using RawV = Raw;
  static constexpr int kParts = 1;
  // Warps of a decode block (one block per SM): a bf16 tile's raw bytes need more than 128
  // registers a thread, so 4 warps; an fp8 tile's fit 128, so 16 warps share one block's splits.
  static constexpr int kDecodeWarps = kFp8 ? 16 : 4;
  static constexpr int kChunkBytes = kFp8 ? 8 : 16;
  __device__ __forceinline__ const uint8_t* ChunkPtr(const uint8_t* tile, int slot, int d0) const {
    const int64_t e = static_cast<int64_t>(slot) * g.head_dim + d0;
    return tile + e * (kFp8 ? 1 : 2);
  }
  // Chunks of the little-endian words w (LoadBytes).
  template <int N>
  __device__ __forceinline__ static void SplitChunks(const uint32_t* w, Raw (&out)[N]) {
#pragma unroll
    for (int c = 0; c < N; ++c) {
      if constexpr (kFp8) {
        out[c] = make_uint2(w[2 * c], w[2 * c + 1]);
      } else {
        out[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
      }
    }
  }
  __device__ __forceinline__ void Bf16Pair(const Raw& r, int /*chunk*/, int p, uint32_t& hi,
                                           uint32_t&) const {
    if constexpr (kFp8) {
      const uint32_t w = p < 2 ? r.x : r.y;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(w >> (16 * (p % 2))), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: 3 mantissa bits
      hi = *reinterpret_cast<const uint32_t*>(&b);
    } else {
      hi = p == 0 ? r.x : p == 1 ? r.y : p == 2 ? r.z : r.w;
    }
  }
  // The Vᵀ operands of m-tiles 2w and 2w + 1: [m-tile][a0..a3] = (dim j, keys 2t, 2t+1), (dim
  // D/16 + j, the same keys), then the same for keys 8+2t, 9+2t, with j = 2w + jj the lane's dim
  // (of its D/8) and v the lane's raw chunks of those four keys: words w and D/32 + w of each key
  // as bf16 pairs of dims, regrouped by key. No low parts (a_l is not read).
  template <int D>
  __device__ __forceinline__ void ValueOperands(const Raw (&v)[4][D / 64], int w,
                                                uint32_t (&a_h)[2][4], uint32_t (&)[2][4]) const {
    uint32_t words[2][4], unused;  // [low, high word][key 2t, 2t+1, 8+2t, 9+2t]
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int word = w + half * (D / 32);
        Bf16Pair(v[c4][word / 4], 0, word % 4, words[half][c4], unused);
      }
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const uint32_t sel = jj ? 0x7632 : 0x5410;  // dim 2w + jj: low or high half of word w
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          a_h[jj][2 * u + half] = __byte_perm(words[half][2 * u], words[half][2 * u + 1], sel);
        }
      }
    }
  }
  // Queries and outputs are in the cache's frame already.
  template <int D>
  __device__ __forceinline__ void RotateQuery(float*, int, int) const {}
  template <int D>
  __device__ __forceinline__ void RotateOutput(float*, int, int) const {}
  // The vector's scale as loaded (ScaleOf converts it): fp8's fp32, 4-byte aligned where the
  // decode kernel runs (DecodeAligned); bf16 has none.
  __device__ __forceinline__ uint32_t ScaleBits(const uint8_t* tile, int slot, int /*part*/) const {
    if constexpr (kFp8) {
      return *reinterpret_cast<const uint32_t*>(
          tile + static_cast<int64_t>(g.block_size) * g.head_dim + 4 * slot);
    } else {
      return 0;
    }
  }
  __device__ __forceinline__ static float ScaleOf(uint32_t bits) {
    return kFp8 ? __uint_as_float(bits) : 1.f;
  }
  // Elements d0 .. d0 + 7 of one vector: one 16-byte (bf16) or 8-byte (fp8) load.
  __device__ __forceinline__ void Chunk(const uint8_t* tile, int slot, int d0,
                                        float (&out)[kChunk]) const {
    const int D = g.head_dim;
    if constexpr (kFp8) {
      const float s = LoadF32Bytes(tile + static_cast<int64_t>(g.block_size) * D + 4 * slot);
      const uint2 raw = *reinterpret_cast<const uint2*>(tile + static_cast<int64_t>(slot) * D + d0);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        const uint32_t w = e < 4 ? raw.x : raw.y;
        out[e] = s * E4m3Value(static_cast<uint8_t>(w >> (8 * (e % 4))));
      }
    } else {
      const uint4 raw = *reinterpret_cast<const uint4*>(
          tile + (static_cast<int64_t>(slot) * D + d0) * sizeof(uint16_t));
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int e = 0; e < kChunk; ++e) {
        out[e] = __uint_as_float(e % 2 == 0 ? w[e / 2] << 16 : w[e / 2] & 0xffff0000u);
      }
    }
  }
};

// The word of a centroid table (in shared memory, aligned to its size) for the b-bit code at bits
// `bit` .. `bit` + b - 1 of r: its address is the table's OR the code's byte offset, so that one
// LOP3 both extracts the code and addresses its entry (an add is one instruction more per code).
template <typename R>
__device__ __forceinline__ uint32_t TableEntry(const uint32_t* table, R r, int bit, int b) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(table));
  const int shift = bit - 2;  // compile-time after unrolling
  const uint32_t offset =
      static_cast<uint32_t>(shift >= 0 ? r >> shift : r << -shift) & (((1u << b) - 1u) << 2);
  uint32_t entry;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(entry) : "r"(base | offset));
  return entry;
}

// K/V source over TurboQuant tiles, in the rotated frame: element d of slot = s · C[idx_d].
template <int kBits>  // the index width b, 1..4: shifts and loads fixed at compile time
struct TqKvSource : PagedLoads<TqKvSource<kBits>> {
  PagedGeom g;
  TqTables tb;
  __device__ __forceinline__ float Element(const uint8_t* tile, int slot, int d) const {
    constexpr int b = kBits;
    const int index_bytes = g.head_dim * b / 8;
    const uint32_t c = IndexAt(tile + static_cast<int64_t>(slot) * index_bytes, d, b);
    const float s = LoadF16Bytes(tile + static_cast<int64_t>(g.block_size) * index_bytes + 2 * slot);
    return s * tb.centroids[c];
  }
  // The codebook in shared memory (Prepare, before the kernel's first barrier).
  __device__ __forceinline__ float* Centroids() const {
    __shared__ float centroids[1 << kBits];
    return centroids;
  }
  // Each centroid as bf16 hi | lo << 16, hi + lo = the fp32 centroid to 2^-16 (DecodeAttention),
  // aligned to its size (TableEntry).
  // (A table of code pairs, one 8-byte load per two codes and no byte permutes, ran slower: its
  // 64 and 256 entries for 3 and 4 bits conflict on the shared-memory banks; NOTES.md.)
  __device__ __forceinline__ uint32_t* CentroidHiLo() const {
    __shared__ __align__(4 << kBits) uint32_t hilo[1 << kBits];
    return hilo;
  }
  __device__ __forceinline__ void Prepare() const {
    for (int i = threadIdx.x; i < (1 << kBits); i += blockDim.x) {
      const float c = tb.centroids[i];
      const uint32_t hi = F32ToBf16Bits(c);
      Centroids()[i] = c;
      CentroidHiLo()[i] = hi | uint32_t{F32ToBf16Bits(c - __uint_as_float(hi << 16))} << 16;
    }
  }
  // Tiles 4-byte aligned: b = 4 codes are one 32-bit load, b = 2 one 16-bit load, the fp16
  // scale one 16-bit load (head_dim a multiple of 8).
  __host__ __device__ __forceinline__ bool ChunksAligned() const { return g.AlignedTo(4); }
  // Elements d0 .. d0 + 7: their 8 b-bit codes are the b bytes at b · d0 / 8 (byte aligned).
  __device__ __forceinline__ void Chunk(const uint8_t* tile, int slot, int d0,
                                        float (&out)[kChunk]) const {
    constexpr int b = kBits;
    const int index_bytes = g.head_dim * b / 8;
    const uint8_t* codes = tile + static_cast<int64_t>(slot) * index_bytes + b * (d0 / 8);
    uint32_t w = 0;
    if constexpr (b == 4) {
      w = *reinterpret_cast<const uint32_t*>(codes);
    } else if constexpr (b == 2) {
      w = *reinterpret_cast<const uint16_t*>(codes);
    } else {
      for (int i = 0; i < b; ++i) w |= static_cast<uint32_t>(codes[i]) << (8 * i);
    }
    const float s = __half2float(*reinterpret_cast<const __half*>(
        tile + static_cast<int64_t>(g.block_size) * index_bytes + 2 * slot));
    const uint32_t mask = (1u << b) - 1u;
    const float* c = Centroids();
#pragma unroll
    for (int e = 0; e < kChunk; ++e) out[e] = s * c[(w >> (e * b)) & mask];
  }
  // DecodeAttentionKernel's interface: raw chunks of 8 codes (ChunkPtr, SplitChunks), the
  // centroids of codes 2p and 2p + 1 of a chunk as a bf16 pair of high parts and one of low parts
  // (Bf16Pair), the Vᵀ operands (ValueOperands) and the vector's scale.
  static constexpr bool kLowHalf = true;
  static constexpr bool kCombineRotates = false;  // see TqSplitKvSource
  using Raw = uint32_t;
  using RawV = Raw;
  static constexpr int kParts = 1;
  static constexpr int kDecodeWarps = 16;  // 128 registers a thread (as PagedKvSource<true>)
  static constexpr int kChunkBytes = kBits;  // 8 codes of b bits
  __device__ __forceinline__ const uint8_t* ChunkPtr(const uint8_t* tile, int slot, int d0) const {
    return tile + static_cast<int64_t>(slot) * (g.head_dim * kBits / 8) + kBits * (d0 / 8);
  }
  // Chunks of the little-endian words w (LoadBytes): chunk c is bits 8bc .. 8b(c + 1) - 1.
  template <int N>
  __device__ __forceinline__ static void SplitChunks(const uint32_t* w, Raw (&out)[N]) {
    constexpr int kChunkBits = 8 * kBits;
#pragma unroll
    for (int c = 0; c < N; ++c) {
      const int bit = kChunkBits * c, k = bit / 32, shift = bit % 32;  // compile-time
      uint32_t x = w[k] >> shift;
      if (shift + kChunkBits > 32) x |= w[k + 1] << (32 - shift);
      out[c] = kChunkBits == 32 ? x : x & ((1u << kChunkBits) - 1u);
    }
  }
  // CentroidHiLo's entry for code e of chunk r (bits e b .. e b + b - 1).
  __device__ __forceinline__ uint32_t Entry(const Raw& r, int e) const {
    return TableEntry(CentroidHiLo(), r, e * kBits, kBits);
  }
  __device__ __forceinline__ void Bf16Pair(const Raw& r, int /*chunk*/, int p, uint32_t& hi,
                                           uint32_t& lo) const {
    const uint32_t x = Entry(r, 2 * p), y = Entry(r, 2 * p + 1);
    hi = __byte_perm(x, y, 0x5410);
    lo = __byte_perm(x, y, 0x7632);
  }
  // The Vᵀ operands of m-tiles 2w and 2w + 1 (layout: PagedKvSource::ValueOperands), high and
  // low parts: each pair of keys at one dim straight from two lookups (decoding a key's dims in
  // pairs first, then regrouping them by key, took twice the byte permutes).
  template <int D>
  __device__ __forceinline__ void ValueOperands(const Raw (&v)[4][D / 64], int w,
                                                uint32_t (&a_h)[2][4], uint32_t (&a_l)[2][4]) const {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int elem = 2 * w + jj + half * (D / 16);  // of the lane's D / 8 dims
          const uint32_t x = Entry(v[2 * u][elem / 8], elem % 8);
          const uint32_t y = Entry(v[2 * u + 1][elem / 8], elem % 8);
          a_h[jj][2 * u + half] = __byte_perm(x, y, 0x5410);
          a_l[jj][2 * u + half] = __byte_perm(x, y, 0x7632);
        }
      }
    }
  }
  // q' = Π_K q before the products and out = Πᵀ_V acc after them, on `rows` vectors v[r · D ..]
  // in shared memory (query heads of kv head kvh), one warp a vector; the caller syncs after.
  template <int D>
  __device__ __forceinline__ void RotateQuery(float* v, int rows, int kvh) const {
    for (int r = threadIdx.x / kWarp; r < rows; r += blockDim.x / kWarp) {
      WarpRht2<D>(v + r * D, tb.D1(kvh, 0, D), tb.D2(kvh, 0, D), true);
    }
  }
  template <int D>
  __device__ __forceinline__ void RotateOutput(float* v, int rows, int kvh) const {
    for (int r = threadIdx.x / kWarp; r < rows; r += blockDim.x / kWarp) {
      WarpRht2<D>(v + r * D, tb.D1(kvh, 1, D), tb.D2(kvh, 1, D), false);
    }
  }
  // The fp16 scale as loaded (ScaleOf converts it).
  __device__ __forceinline__ uint32_t ScaleBits(const uint8_t* tile, int slot, int /*part*/) const {
    return *reinterpret_cast<const uint16_t*>(
        tile + static_cast<int64_t>(g.block_size) * (g.head_dim * kBits / 8) + 2 * slot);
  }
  __device__ __forceinline__ static float ScaleOf(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
};

// q' = Π_K q (forward) before attention, out = Πᵀ_V acc after it; one block per (token, head).
__global__ void TqRotateKernel(float* dst, const float* src, TqTables tb, int num_heads, int group,
                               int D, bool forward) {
  WaitForPriorKernel();
  extern __shared__ float tq_smem[];
  const int64_t row = blockIdx.x;  // t * NH + h
  const int h = static_cast<int>(row % num_heads), kvh = h / group;
  for (int i = threadIdx.x; i < D; i += blockDim.x) tq_smem[i] = src[row * D + i];
  __syncthreads();
  const int role = forward ? 0 : 1;
  BlockRht2(tq_smem, D, tb.D1(kvh, role, D), tb.D2(kvh, role, D), forward);
  for (int i = threadIdx.x; i < D; i += blockDim.x) dst[row * D + i] = tq_smem[i];
}

// KvCodec::PrepareQuery, q' = [Π_O q_O, Π_R q_R] with the key codec's tables, for one (token,
// head) row per block of 128 threads.
__global__ __launch_bounds__(kSplitD) void TqSplitRotateKernel(float* dst, const float* src,
                                                               TqSplitTables tb, int num_heads,
                                                               int group) {
  extern __shared__ __align__(16) float haar_t_s[];  // Π_Rᵀ [96 · 96]
  __shared__ float u_s[kSplitD];
  const int64_t row = blockIdx.x;  // t * NH + h
  const int kvh = static_cast<int>(row % num_heads) / group, p = threadIdx.x;
  // The constant tables before the wait: loaded while the kernel before runs.
  StageSplitMatrix(haar_t_s, tb.HaarT(kvh, 0));
  const int channel = tb.Channel(kvh, 0, p);
  const SplitSigns signs = LoadSplitSigns(tb, kvh, 0);
  WaitForPriorKernel();
  u_s[p] = src[row * kSplitD + channel];
  __syncthreads();
  dst[row * kSplitD + p] = SplitRotatePosition(haar_t_s, u_s, signs, true);
}

// The split formats' combine (of one split or more: p.partials) and KvCodec::FinishValues, out
// scattered from [Π_Oᵀ acc_O, Π_Rᵀ acc_R] with the value codec's tables, in one kernel: one
// (token, head) row per block of 128 threads. The combine: warp j takes splits j, j + 4, ...,
// lane c rotated positions 4c .. 4c + 3 (one 16-byte load a split: a thread's loads go out
// together); the rotation: thread p rotated position p.
__global__ __launch_bounds__(kSplitD) void TqSplitCombineKernel(const AttnParams p,
                                                                TqSplitTables tb) {
  constexpr int kGroups = kSplitD / kWarp;
  extern __shared__ __align__(16) float haar_s[];  // Π_R [96 · 96], then the weights [splits]
  __shared__ __align__(16) float sum_s[kGroups][kSplitD];
  __shared__ float u_s[kSplitD], red[kWarp];
  const int64_t row = blockIdx.x, rows = p.total_tokens * p.a.num_heads;  // row: t * NH + h
  const int kvh = static_cast<int>(row % p.a.num_heads) / p.group, pos = threadIdx.x;
  // The constant tables before the wait: loaded while the kernel before runs.
  StageSplitMatrix(haar_s, tb.Haar(kvh, 1));
  const int channel = tb.Channel(kvh, 1, pos);
  const SplitSigns signs = LoadSplitSigns(tb, kvh, 1);
  WaitForPriorKernel();
  float* weight = haar_s + kSplitR * kSplitR;
  const float den = CombineWeights(p, row, weight, red);
  const int j = pos / kWarp, c = pos % kWarp;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int z = j; z < p.num_splits; z += kGroups) {
    const float4 o = reinterpret_cast<const float4*>(p.part_o + (z * rows + row) * kSplitD)[c];
    const float w = weight[z];
    acc.x = fmaf(w, o.x, acc.x), acc.y = fmaf(w, o.y, acc.y);
    acc.z = fmaf(w, o.z, acc.z), acc.w = fmaf(w, o.w, acc.w);
  }
  reinterpret_cast<float4*>(sum_s[j])[c] = acc;
  __syncthreads();
  float num = 0.f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) num += sum_s[g][pos];
  u_s[pos] = num / den;
  __syncthreads();
  p.a.out[row * kSplitD + channel] = SplitRotatePosition(haar_s, u_s, signs, false);
}

// K/V source of AttentionKernel over split tiles, in the rotated frame: element d of a slot is
// s_O · C_O[idx_d] for d < 32 and s_R · C_R[idx_d] after.
template <int kBitsO, int kBitsR>
struct TqSplitKvSource : PagedLoads<TqSplitKvSource<kBitsO, kBitsR>> {
  using Planes = SplitPlanes<kBitsO, kBitsR>;
  PagedGeom g;
  TqSplitTables tb;
  // Both codebooks in shared memory (Prepare, before the kernel's first barrier).
  __device__ __forceinline__ float* Centroids() const {
    __shared__ float centroids[(1 << kBitsO) + (1 << kBitsR)];
    return centroids;
  }
  // Each part's centroids as bf16 hi | lo << 16, aligned to the table's size (TqKvSource::
  // CentroidHiLo): the decode kernel's lookups.
  __device__ __forceinline__ uint32_t* HiLoO() const {
    __shared__ __align__(4 << kBitsO) uint32_t hilo[1 << kBitsO];
    return hilo;
  }
  __device__ __forceinline__ uint32_t* HiLoR() const {
    __shared__ __align__(4 << kBitsR) uint32_t hilo[1 << kBitsR];
    return hilo;
  }
  __device__ __forceinline__ void Prepare() const {
    for (int i = threadIdx.x; i < (1 << kBitsO) + (1 << kBitsR); i += blockDim.x) {
      const bool o = i < (1 << kBitsO);
      const float c = o ? tb.centroids_o[i] : tb.centroids_r[i - (1 << kBitsO)];
      const uint32_t hi = F32ToBf16Bits(c);
      Centroids()[i] = c;
      (o ? HiLoO()[i] : HiLoR()[i - (1 << kBitsO)]) =
          hi | uint32_t{F32ToBf16Bits(c - __uint_as_float(hi << 16))} << 16;
    }
  }
  __device__ __forceinline__ float Element(const uint8_t* tile, int slot, int d) const {
    const bool outlier = d < kSplitO;
    const int b = outlier ? kBitsO : kBitsR, j = outlier ? d : d - kSplitO;
    const int bs = g.block_size;
    const uint32_t c =
        IndexAt(tile + (outlier ? Planes::IndexO(bs, slot) : Planes::IndexR(bs, slot)), j, b);
    const float s =
        LoadF16Bytes(tile + (outlier ? Planes::ScaleO(bs, slot) : Planes::ScaleR(bs, slot)));
    return s * Centroids()[outlier ? c : (1 << kBitsO) + c];
  }
  // Byte loads: a chunk's b bytes need no alignment.
  __host__ __device__ __forceinline__ bool ChunksAligned() const { return true; }
  // Elements d0 .. d0 + 7 (d0 a multiple of 8, so within one part): 8 codes in b whole bytes.
  __device__ __forceinline__ void Chunk(const uint8_t* tile, int slot, int d0,
                                        float (&out)[kChunk]) const {
    const bool outlier = d0 < kSplitO;
    const int b = outlier ? kBitsO : kBitsR, j0 = outlier ? d0 : d0 - kSplitO;
    const int bs = g.block_size;
    const uint8_t* codes = tile + (outlier ? Planes::IndexO(bs, slot) : Planes::IndexR(bs, slot)) +
                           b * (j0 / 8);
    uint32_t w = 0;
    for (int i = 0; i < b; ++i) w |= static_cast<uint32_t>(codes[i]) << (8 * i);
    const float s =
        LoadF16Bytes(tile + (outlier ? Planes::ScaleO(bs, slot) : Planes::ScaleR(bs, slot)));
    const float* c = Centroids() + (outlier ? 0 : 1 << kBitsO);
    const uint32_t mask = (1u << b) - 1u;
#pragma unroll
    for (int e = 0; e < kChunk; ++e) out[e] = s * c[(w >> (e * b)) & mask];
  }

  // DecodeAttentionKernel's interface with two parts (the layout hooks of PagedLoads replaced).
  // The kernel works in the rotated frame: TqSplitRotateKernel rotates the queries before it, and
  // its combine (always partials, kCombineRotates) rotates the output back.
  static constexpr bool kCombineRotates = true;
  void LaunchCombine(const AttnParams& p, cudaStream_t stream) const {
    Launch(TqSplitCombineKernel, static_cast<unsigned>(p.total_tokens * p.a.num_heads), kSplitD,
           kSplitMatrixBytes + p.num_splits * sizeof(float), stream, p, tb);
  }
  // Keys: lane t's chunk 0 is outlier dims [8t, 8t + 8), chunks 1..3 the rest's dims
  // [24t + 8(i − 1), + 8) (rotated positions 32 + those): one part a chunk, so each part's
  // products sum apart and meet their own scale. Values: m-tiles 0, 1 are outlier dims (lane g's
  // [4g, 4g + 4): row g the first pair, row g + 8 the second), m-tiles 2..7 the rest's (lane
  // g's [12g, 12g + 12): row g the first six, g + 8 the last), so a pair of m-tiles is one part.
  static constexpr int kParts = 2;
  static constexpr bool kLowHalf = true;
  using Raw = uint32_t;    // 8 codes of a key chunk
  using RawV = uint32_t;   // a value's codes for one lane: two words (ValueUnpack)
  static constexpr int kDecodeWarps = 16;
  template <int D>
  __host__ __device__ static constexpr int KeyChunkDim(int t, int i) {
    return i == 0 ? 8 * t : kSplitO + 24 * t + 8 * (i - 1);
  }
  __host__ __device__ static constexpr int KeyChunkPart(int i) { return i == 0 ? 0 : 1; }
  __host__ __device__ static constexpr int ValuePart(int w) { return w == 0 ? 0 : 1; }
  template <int D>
  __host__ __device__ static constexpr int ValueDim(int g, int j, int half) {
    return j < 2 ? 4 * g + 2 * half + j : kSplitO + 12 * g + 6 * half + (j - 2);
  }
  // Code planes start on 4-byte boundaries when the tiles do.
  __host__ __device__ __forceinline__ bool DecodeAligned() const { return g.AlignedTo(4); }
  // Words that hold an n-bit field at bit k · n of a plane, whatever k: the field starts at a
  // multiple of the largest power of two dividing n (and 32) within its first word.
  __host__ __device__ static constexpr int FieldWords(int n) {
    int align = 32;
    while (n % align != 0) align /= 2;
    return (32 - align + n + 31) / 32;
  }
  // A lane's fields: of a key, 8 codes of the outlier plane at bit 8 t b_O and 24 of the rest's
  // at bit 24 t b_R (chunks 1..3); of a value, 4 of the outlier plane at bit 4 g b_O and 12 of
  // the rest's at bit 12 g b_R. Loaded as the aligned words that hold them (KeyLoad, ValueLoad:
  // the outlier field's words, then the rest's), shifted into place by KeyUnpack and
  // ValueUnpack when the tile's turn comes (DecodeLoads).
  static constexpr int kKeyO = 8 * kBitsO, kKeyR = 24 * kBitsR;
  static constexpr int kValueO = 4 * kBitsO, kValueR = 12 * kBitsR;
  static constexpr int kKeyWords = FieldWords(kKeyO) + FieldWords(kKeyR);
  static constexpr int kValueWords = FieldWords(kValueO) + FieldWords(kValueR);
  template <int kBitsN>
  __device__ __forceinline__ static void LoadField(const uint8_t* plane, int k, uint32_t* w) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(plane) + (k * kBitsN >> 5);
#pragma unroll
    for (int i = 0; i < FieldWords(kBitsN); ++i) w[i] = words[i];
  }
  template <int kBitsN>
  __device__ __forceinline__ static void ShiftField(const uint32_t* w, int k, uint32_t* a) {
    constexpr int kWords = FieldWords(kBitsN);
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      a[i] = __funnelshift_r(w[i], i + 1 < kWords ? w[i + 1] : 0u, k * kBitsN & 31);
    }
  }
  // tile == nullptr: a key or value outside the split (zero codes; its weight is zero).
  __device__ __forceinline__ void KeyLoad(const uint8_t* tile, int slot, int t,
                                          uint32_t (&w)[kKeyWords]) const {
#pragma unroll
    for (int i = 0; i < kKeyWords; ++i) w[i] = 0;
    if (tile == nullptr) return;
    LoadField<kKeyO>(tile + Planes::IndexO(g.block_size, slot), t, w);
    LoadField<kKeyR>(tile + Planes::IndexR(g.block_size, slot), t, w + FieldWords(kKeyO));
  }
  __device__ __forceinline__ static void KeyUnpack(const uint32_t (&w)[kKeyWords], int t,
                                                   Raw (&k)[4]) {
    uint32_t o[FieldWords(kKeyO)], r[FieldWords(kKeyR)];
    ShiftField<kKeyO>(w, t, o);
    ShiftField<kKeyR>(w + FieldWords(kKeyO), t, r);
    k[0] = o[0];
    Raw rest[3];
    TqKvSource<kBitsR>::SplitChunks(r, rest);
    k[1] = rest[0], k[2] = rest[1], k[3] = rest[2];
  }
  __device__ __forceinline__ void ValueLoad(const uint8_t* vtile, int slot, int lane_g,
                                            uint32_t (&w)[kValueWords]) const {
#pragma unroll
    for (int i = 0; i < kValueWords; ++i) w[i] = 0;
    if (vtile == nullptr) return;
    LoadField<kValueO>(vtile + Planes::IndexO(g.block_size, slot), lane_g, w);
    LoadField<kValueR>(vtile + Planes::IndexR(g.block_size, slot), lane_g, w + FieldWords(kValueO));
  }
  // A value's codes packed into 52 bits (tq3.5; 36 for tq2.5) of v[0] | v[1] << 32: the outlier
  // codes at bit 0, the rest's at kValueRestBit (two registers a value, not a 64-bit word a
  // part: the decode kernel is at its 128 registers a thread).
  static constexpr int kValueRestBit = kValueO;
  __device__ __forceinline__ static void ValueUnpack(const uint32_t (&w)[kValueWords], int lane_g,
                                                     RawV (&v)[2]) {
    uint32_t o[FieldWords(kValueO)], r[FieldWords(kValueR)];
    ShiftField<kValueO>(w, lane_g, o);
    ShiftField<kValueR>(w + FieldWords(kValueO), lane_g, r);
    uint64_t packed = (o[0] & ((1u << kValueO) - 1u)) | uint64_t{r[0]} << kValueRestBit;
    if constexpr (kValueR > 32) packed |= uint64_t{r[1]} << (32 + kValueRestBit);
    v[0] = static_cast<uint32_t>(packed), v[1] = static_cast<uint32_t>(packed >> 32);
  }
  // The hi | lo entry of code e (bits `first` + e b ..) of raw codes r of part `part`.
  template <typename R>
  __device__ __forceinline__ uint32_t Entry(R r, int e, int part, int first = 0) const {
    return part == 0 ? TableEntry(HiLoO(), r, first + e * kBitsO, kBitsO)
                     : TableEntry(HiLoR(), r, first + e * kBitsR, kBitsR);
  }
  __device__ __forceinline__ void Bf16Pair(const Raw& r, int chunk, int p, uint32_t& hi,
                                           uint32_t& lo) const {
    const int part = KeyChunkPart(chunk);
    const uint32_t x = Entry(r, 2 * p, part), y = Entry(r, 2 * p + 1, part);
    hi = __byte_perm(x, y, 0x5410);
    lo = __byte_perm(x, y, 0x7632);
  }
  template <int D>
  __device__ __forceinline__ void ValueOperands(const RawV (&v)[4][2], int w,
                                                uint32_t (&a_h)[2][4], uint32_t (&a_l)[2][4]) const {
    const int part = ValuePart(w), first = part == 0 ? 0 : kValueRestBit;
    auto packed = [&](int c4) { return uint64_t{v[c4][0]} | uint64_t{v[c4][1]} << 32; };
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int j = 2 * w + jj;
#pragma unroll
      for (int u = 0; u < 2; ++u) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int e = part == 0 ? 2 * half + j : 6 * half + (j - 2);  // of the lane's codes
          const uint32_t x = Entry(packed(2 * u), e, part, first);
          const uint32_t y = Entry(packed(2 * u + 1), e, part, first);
          a_h[jj][2 * u + half] = __byte_perm(x, y, 0x5410);
          a_l[jj][2 * u + half] = __byte_perm(x, y, 0x7632);
        }
      }
    }
  }
  template <int D>
  __device__ __forceinline__ void RotateQuery(float*, int, int) const {}
  template <int D>
  __device__ __forceinline__ void RotateOutput(float*, int, int) const {}
  // A part's fp16 scale as loaded (ScaleOf converts it).
  __device__ __forceinline__ uint32_t ScaleBits(const uint8_t* tile, int slot, int part) const {
    const int bs = g.block_size;
    return *reinterpret_cast<const uint16_t*>(
        tile + (part == 0 ? Planes::ScaleO(bs, slot) : Planes::ScaleR(bs, slot)));
  }
  __device__ __forceinline__ static float ScaleOf(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
};

// ---- The 16-bit tail (PagedAttentionArgs::k_new, PagedKvLayer::tail) ---------------------------
// The compressed kernels above run with key lag W (AttnParams::key_lag): row p sees s <= p - W,
// and their combine leaves each row's max and denominator in row_ml. PagedTailKernel then adds
// positions (p - W, p] in 16 bits and merges the two softmaxes into out.

// One sequence of a call: its rows of q and out and its ring. Layer-invariant (staged once a
// step, like the block tables): the ring as an offset from the call's first one.
struct TailSeq {
  int64_t start_pos = 0, token_offset = 0;
  int64_t ring_offset = 0;  // elements from TailParams::ring
};

struct TailParams {
  float* out = nullptr;           // [T, NH, D]: the compressed part's, normalised; merged in place
  const float* q = nullptr;       // [T, NH, D], the original frame
  const float* row_ml = nullptr;  // [T * NH, 2] (AttnParams::row_ml)
  const TailSeq* seqs = nullptr;  // token_offset ascending
  int num_seqs = 0;
  const uint16_t* ring = nullptr;  // the first sequence's ring: [W][NKV][2 (K, V)][D] bf16
  const float* k_new = nullptr;    // [T, NKV, D], every sequence's new tokens in turn
  const float* v_new = nullptr;
  int num_heads = 0, group = 1, num_kv_heads = 0, head_dim = 0, tail_tokens = 0;
  float scale = 1.f;
  int64_t sliding_window = 0;
};

// Element d of position s's key (role 0) or value (role 1) in 16 bits: the step's new vector
// rounded to bf16 when s is new, else the ring's (the CPU's TailVector).
__device__ __forceinline__ float TailElement(const TailParams& p, const TailSeq& sq, int64_t s,
                                             int kvh, int role, int d) {
  const int D = p.head_dim, NKV = p.num_kv_heads;
  uint16_t bits;
  if (s >= sq.start_pos) {
    const int64_t token = sq.token_offset + s - sq.start_pos;
    bits = F32ToBf16Bits((role == 0 ? p.k_new : p.v_new)[(token * NKV + kvh) * D + d]);
  } else {
    bits = p.ring[sq.ring_offset + (((s % p.tail_tokens) * NKV + kvh) * 2 + role) * D + d];
  }
  return __uint_as_float(uint32_t{bits} << 16);
}

// One (token, head) row a block: each warp an online softmax over its share of the tail
// positions, kTailUnroll at a time with all their loads issued first (latency-bound otherwise;
// lane owns dims lane + 32i), then the warps and the compressed part (its normalised output
// times its denominator) merged: out = (sum of numerators) / (sum of denominators) at one max.
constexpr int kTailWarps = 8, kTailCols = 256 / kWarp, kTailUnroll = 4;
__global__ __launch_bounds__(kTailWarps* kWarp) void PagedTailKernel(const TailParams p) {
  WaitForPriorKernel();
  __shared__ float o_s[kTailWarps][256];
  __shared__ float m_s[kTailWarps], l_s[kTailWarps];
  const int64_t row = blockIdx.x, t = row / p.num_heads;  // row: t * NH + h
  const int kvh = static_cast<int>(row % p.num_heads) / p.group, D = p.head_dim;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int lo_seq = 0, hi_seq = p.num_seqs - 1;  // the last sequence starting at or before token t
  while (lo_seq < hi_seq) {
    const int mid = (lo_seq + hi_seq + 1) / 2;
    if (p.seqs[mid].token_offset <= t) {
      lo_seq = mid;
    } else {
      hi_seq = mid - 1;
    }
  }
  const TailSeq sq = p.seqs[lo_seq];
  const int64_t pos = sq.start_pos + (t - sq.token_offset);
  const int64_t first = p.sliding_window > 0 ? Max64(0, pos - p.sliding_window + 1) : 0;
  const int64_t lo = Max64(first, pos - p.tail_tokens + 1);
  float q[kTailCols], acc[kTailCols];
#pragma unroll
  for (int i = 0; i < kTailCols; ++i) {
    const int d = lane + i * kWarp;
    q[i] = d < D ? p.q[row * D + d] : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t s0 = lo + warp * kTailUnroll; s0 <= pos; s0 += kTailWarps * kTailUnroll) {
    float kx[kTailUnroll][kTailCols], vx[kTailUnroll][kTailCols];
#pragma unroll
    for (int u = 0; u < kTailUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kTailCols; ++i) {
        const int d = lane + i * kWarp;
        const bool in = s0 + u <= pos && d < D;
        kx[u][i] = in ? TailElement(p, sq, s0 + u, kvh, 0, d) : 0.f;
        vx[u][i] = in ? TailElement(p, sq, s0 + u, kvh, 1, d) : 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kTailUnroll; ++u) {
      if (s0 + u > pos) break;  // warp-uniform
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kTailCols; ++i) dot = fmaf(q[i], kx[u][i], dot);
      const float score = WarpSum(dot) * p.scale;
      const float m_new = fmaxf(m, score);
      const float corr = expf(m - m_new), e = expf(score - m_new);  // corr 0 at the first
      l = l * corr + e;
      m = m_new;
#pragma unroll
      for (int i = 0; i < kTailCols; ++i) acc[i] = fmaf(e, vx[u][i], acc[i] * corr);
    }
  }
#pragma unroll
  for (int i = 0; i < kTailCols; ++i) {
    const int d = lane + i * kWarp;
    if (d < D) o_s[warp][d] = acc[i];
  }
  if (lane == 0) m_s[warp] = m, l_s[warp] = l;
  __syncthreads();
  // The compressed part: none when its denominator is 0 (no position before p - W + 1).
  const float m_c = p.row_ml[2 * row], den_c = p.row_ml[2 * row + 1];
  float M = den_c > 0.f ? m_c : -INFINITY;
  for (int w = 0; w < kTailWarps; ++w) M = fmaxf(M, m_s[w]);  // finite: position p is in the tail
  const float w_c = den_c > 0.f ? den_c * expf(m_c - M) : 0.f;
  float den = w_c, w_t[kTailWarps];
  for (int w = 0; w < kTailWarps; ++w) {
    w_t[w] = m_s[w] == -INFINITY ? 0.f : expf(m_s[w] - M);
    den = fmaf(w_t[w], l_s[w], den);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float num = w_c > 0.f ? w_c * p.out[row * D + d] : 0.f;
    for (int w = 0; w < kTailWarps; ++w) num = fmaf(w_t[w], o_s[w][d], num);
    p.out[row * D + d] = num / den;
  }
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

namespace {

// Whether prefill chunks of a bf16 cache take the flash kernel (prefill_attention.cuh): the
// default; MOE_PREFILL_ATTENTION=0 keeps them on the decode kernel (an A/B switch for
// measurements).
bool PrefillKernelOn() {
  static const bool on = [] {
    const char* env = std::getenv("MOE_PREFILL_ATTENTION");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return on;
}

// True when the batch can be one launch: every element reads the same layer of the same cache
// and its rows of q/out follow the previous element's.
bool OneLaunch(absl::Span<const PagedAttentionArgs> batch) {
  const PagedAttentionArgs& a = batch[0];
  const int64_t row = static_cast<int64_t>(a.num_heads) * a.kv.head_dim;
  const int64_t kv_row = static_cast<int64_t>(a.kv.num_kv_heads) * a.kv.head_dim;
  int64_t tokens = 0;
  for (const PagedAttentionArgs& e : batch) {
    if (!SameLayer(a.kv, e.kv) || e.num_heads != a.num_heads || e.scale != a.scale ||
        e.sliding_window != a.sliding_window || e.q != a.q + tokens * row ||
        e.out != a.out + tokens * row) {
      return false;
    }
    // A tail: every element has one, and its new K/V follow the previous element's.
    if ((e.kv.tail == nullptr) != (a.kv.tail == nullptr) || e.kv.tail_tokens != a.kv.tail_tokens ||
        (a.kv.tail != nullptr &&
         (e.k_new != a.k_new + tokens * kv_row || e.v_new != a.v_new + tokens * kv_row))) {
      return false;
    }
    tokens += e.num_tokens;
  }
  return true;
}

}  // namespace

absl::Status CudaBackend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  if (batch.empty()) return absl::OkStatus();
  for (const PagedAttentionArgs& e : batch) {
    if (e.kv.tail != nullptr &&
        (e.kv.tail_tokens <= 0 || e.k_new == nullptr || e.v_new == nullptr)) {
      return absl::InvalidArgumentError(
          "PagedAttention: a tail needs tail_tokens > 0 and the step's new keys and values");
    }
  }
  const cuda::PagedPath path = cuda::ChoosePath(batch[0].kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedAttention(batch);  // prod formats
  const PagedAttentionArgs& a = batch[0];
  if (batch.size() > 1 && !OneLaunch(batch)) {
    for (const PagedAttentionArgs& e : batch) MOE_RETURN_IF_ERROR(PagedAttention({e}));
    return absl::OkStatus();
  }
  const PagedKvLayer& kv = a.kv;
  MOE_CHECK(a.num_heads % kv.num_kv_heads == 0)
      << "PagedAttention: heads " << a.num_heads << " kv heads " << kv.num_kv_heads;
  // The sequences' block tables, concatenated, and their descriptors.
  std::vector<int32_t> tables;
  std::vector<cuda::SeqDesc> seqs;
  std::vector<cuda::TailSeq> tail_seqs;
  int64_t tokens = 0;
  for (const PagedAttentionArgs& e : batch) {
    if (kv.tail != nullptr) {
      tail_seqs.push_back({e.start_pos, tokens, ElementOffset(kv.tail, e.kv.tail)});
    }
    MOE_CHECK(e.start_pos >= 0) << "PagedAttention: start_pos " << e.start_pos;
    cuda::SeqDesc sq;
    sq.start_pos = e.start_pos;
    sq.num_tokens = e.num_tokens;
    sq.token_offset = tokens;
    sq.table_offset = static_cast<int32_t>(tables.size());
    seqs.push_back(sq);
    const int64_t blocks = (e.start_pos + e.num_tokens + kv.block_size - 1) / kv.block_size;
    tables.insert(tables.end(), e.kv.block_table, e.kv.block_table + blocks);
    tokens += e.num_tokens;
  }
  if (tokens == 0) return absl::OkStatus();
  cuda::PagedGeom g{kv.layer_base, kv.block_stride, kv.tile_bytes, kv.block_size,
                    kv.num_kv_heads, kv.head_dim, nullptr};
  g.table = static_cast<const int32_t*>(
      StageHostArgs(kv_tables_, tables.data(), tables.size() * sizeof(int32_t)));
  AttentionArgs c;
  c.out = a.out;
  c.q = a.q;
  c.num_heads = a.num_heads;
  c.num_kv_heads = kv.num_kv_heads;
  c.head_dim = kv.head_dim;
  c.scale = a.scale;
  c.sliding_window = a.sliding_window;
  auto reserve = [this](size_t bytes) { return Reserve(work_, bytes); };
  auto stage = [this](const void* host, size_t bytes) {
    return StageHostArgs(kv_seqs_, host, bytes);
  };
  // With a tail the kernels below read the compressed positions up to p - W only and keep each
  // row's softmax max and denominator for PagedTailKernel, launched last.
  cuda::KeyLag lag;
  if (kv.tail != nullptr) {
    lag.lag = kv.tail_tokens;
    lag.row_ml = static_cast<float*>(
        Reserve(kv_tail_ml_, static_cast<size_t>(tokens) * a.num_heads * 2 * sizeof(float)));
  }
  // The tensor-core kernel where the shape fits it (decode steps and prefill chunks), the SIMT
  // one otherwise.
  auto run_seqs = [&](const AttentionArgs& args, const std::vector<cuda::SeqDesc>& some,
                      const auto& src) {
    if (!cuda::RunDecodeAttention(args, some, src, num_sms_, reserve, stage, stream_, lag)) {
      cuda::RunAttention(args, some, src, num_sms_, reserve, stage, stream_, lag);
    }
  };
  auto run = [&](const AttentionArgs& args, const auto& src) { run_seqs(args, seqs, src); };
  if (path == cuda::PagedPath::kTqSplit) {
    // The attention kernels in the rotated frame: the queries rotated first, the output rotated
    // back by the source's combine kernel.
    const cuda::TqSplitTables tb = cuda::TqSplitDeviceTables(kv, TqTablesOnDevice(kv));
    const size_t rows = static_cast<size_t>(tokens) * a.num_heads;
    float* q_rot = static_cast<float*>(Reserve(paged_, rows * kv.head_dim * sizeof(float)));
    cuda::Launch(cuda::TqSplitRotateKernel, static_cast<unsigned>(rows), cuda::kSplitD,
                 cuda::kSplitMatrixBytes, stream_, q_rot, a.q, tb, a.num_heads,
                 a.num_heads / kv.num_kv_heads);
    AttentionArgs rotated = c;
    rotated.q = q_rot;
    if (kv.codecs[0]->format() == KvFormat::kTq3p5) {
      run(rotated, cuda::TqSplitKvSource<4, 3>{{}, g, tb});
    } else {
      run(rotated, cuda::TqSplitKvSource<3, 2>{{}, g, tb});
    }
  } else if (path == cuda::PagedPath::kBf16 || path == cuda::PagedPath::kFp8) {
    // Prefill chunks on the prefill kernel, the other sequences as before.
    auto run_paged = [&](const auto& src, auto fp8) {
      auto run_rest = [&](const AttentionArgs& args, const std::vector<cuda::SeqDesc>& rest) {
        run_seqs(args, rest, src);
      };
      if (!PrefillKernelOn() || !cuda::RunPrefillAttention<decltype(fp8)::value>(
                                    c, seqs, g, lag.lag, stage, stream_, run_rest)) {
        run(c, src);
      }
    };
    if (path == cuda::PagedPath::kFp8) {
      run_paged(cuda::PagedKvSource<true>{{}, g}, std::true_type{});
    } else {
      run_paged(cuda::PagedKvSource<false>{{}, g}, std::false_type{});
    }
  } else {
    // Rotated frame: q' = Π_K q, attention over s · C[idx], out = Πᵀ_V acc. The decode kernel
    // rotates in shared memory itself; otherwise two rotation kernels bracket the SIMT one.
    const cuda::TqTables tb = cuda::TqDeviceTables(kv, TqTablesOnDevice(kv));
    auto run_tq = [&](const auto& src) {
      if (cuda::RunDecodeAttention(c, seqs, src, num_sms_, reserve, stage, stream_, lag)) return;
      const size_t rows = static_cast<size_t>(tokens) * a.num_heads;
      const size_t n = rows * kv.head_dim;
      float* q_rot = static_cast<float*>(Reserve(paged_, 2 * n * sizeof(float)));
      float* o_rot = q_rot + n;
      const int group = a.num_heads / kv.num_kv_heads;
      const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
      const size_t smem = kv.head_dim * sizeof(float);
      cuda::Launch(cuda::TqRotateKernel, static_cast<unsigned>(rows), threads, smem, stream_,
                   q_rot, a.q, tb, a.num_heads, group, kv.head_dim, true);
      AttentionArgs rotated = c;
      rotated.q = q_rot;
      rotated.out = o_rot;
      cuda::RunAttention(rotated, seqs, src, num_sms_, reserve, stage, stream_, lag);
      cuda::Launch(cuda::TqRotateKernel, static_cast<unsigned>(rows), threads, smem, stream_,
                   a.out, o_rot, tb, a.num_heads, group, kv.head_dim, false);
    };
    switch (tb.bits) {  // ChoosePath: tq1 .. tq4
      case 1: run_tq(cuda::TqKvSource<1>{{}, g, tb}); break;
      case 2: run_tq(cuda::TqKvSource<2>{{}, g, tb}); break;
      case 3: run_tq(cuda::TqKvSource<3>{{}, g, tb}); break;
      case 4: run_tq(cuda::TqKvSource<4>{{}, g, tb}); break;
      default: MOE_CHECK(false) << "PagedAttention: TurboQuant with " << tb.bits << " bits";
    }
  }
  if (kv.tail != nullptr) {
    cuda::TailParams tp;
    tp.out = a.out;
    tp.q = a.q;
    tp.row_ml = lag.row_ml;
    tp.seqs = static_cast<const cuda::TailSeq*>(
        StageHostArgs(kv_tail_seqs_, tail_seqs.data(), tail_seqs.size() * sizeof(cuda::TailSeq)));
    tp.num_seqs = static_cast<int>(tail_seqs.size());
    tp.ring = kv.tail;
    tp.k_new = a.k_new;
    tp.v_new = a.v_new;
    tp.num_heads = a.num_heads;
    tp.group = a.num_heads / kv.num_kv_heads;
    tp.num_kv_heads = kv.num_kv_heads;
    tp.head_dim = kv.head_dim;
    tp.tail_tokens = kv.tail_tokens;
    tp.scale = a.scale;
    tp.sliding_window = a.sliding_window;
    cuda::Launch(cuda::PagedTailKernel, static_cast<unsigned>(tokens * a.num_heads),
                 cuda::kTailWarps * cuda::kWarp, 0, stream_, tp);
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
