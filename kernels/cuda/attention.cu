// Causal GQA attention over the contiguous cache on the GPU, flash-attention style (online
// softmax over key tiles in shared memory), split over keys for decode (flash-decoding).
//
// Legend: T tokens, NH query heads, NKV kv heads, G = NH / NKV, D head dim, S cached positions.
// A block takes 16 query rows of one kv head: row qi of [T * G] is token qi / G, head
// kvh * G + qi % G, so the G query heads sharing a kv head share every K/V tile it loads (decode:
// one block holds all G heads of the token). Grid (ceil(T*G / 16), NKV, splits); 4 warps, each
// owning 4 query rows; within a tile lane j scores key j, and each lane owns D/32 output columns.
// With splits > 1 every block writes an unnormalised partial (o, m, l), merged by a second kernel.
// One launch serves a batch of sequences (PagedAttention: a step's items): grid.x runs over the
// query tiles of all of them, and each block finds its sequence in a small device table.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kQRows = 16, kRowsPerWarp = 4, kAttnThreads = 128, kKeys = 32;
constexpr int kChunk = 8;  // K/V elements a source loads at once (LoadChunk)
// The combine kernel keeps one weight per split in shared memory.
constexpr int64_t kMaxSplits = 1024;

// One sequence of a call (device memory). Its tokens are rows token_offset.. of q and out; its
// query tiles are blocks tile_begin.. of grid.x; its block table starts at table_offset.
struct SeqDesc {
  int64_t start_pos = 0, num_tokens = 0, token_offset = 0, tile_begin = 0;
  int32_t table_offset = 0;
};

// a: what all sequences share (q and out are the first sequence's first row; a.num_tokens and
// a.start_pos are unused: each sequence's are in seqs).
struct AttnParams {
  AttentionArgs a;
  const SeqDesc* seqs = nullptr;  // [num_seqs], tile_begin ascending
  int num_seqs = 0;
  int64_t total_tokens = 0;    // T over all sequences
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
  __device__ __forceinline__ ContiguousKv ForSeq(int32_t) const { return *this; }
  __device__ __forceinline__ void Prepare() const {}
  __device__ __forceinline__ void Load(int64_t s, int kvh, int d, float& kv, float& vv) const {
    kv = k[s * stride + kvh * head_dim + d];
    vv = v[s * stride + kvh * head_dim + d];
  }
  __device__ __forceinline__ bool ChunksAligned() const {
    return ((reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v)) & 15) == 0 &&
           stride % 4 == 0;
  }
  // Elements d0 .. d0 + 7 (d0 and head_dim multiples of 8: 16-byte aligned float4 pairs).
  __device__ __forceinline__ void LoadChunk(int64_t s, int kvh, int d0, float (&kv)[kChunk],
                                            float (&vv)[kChunk]) const {
    const int64_t off = s * stride + kvh * head_dim + d0;
    const float4* kp = reinterpret_cast<const float4*>(k + off);
    const float4* vp = reinterpret_cast<const float4*>(v + off);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float4 a = kp[i], b = vp[i];
      kv[4 * i] = a.x, kv[4 * i + 1] = a.y, kv[4 * i + 2] = a.z, kv[4 * i + 3] = a.w;
      vv[4 * i] = b.x, vv[4 * i + 1] = b.y, vv[4 * i + 2] = b.z, vv[4 * i + 3] = b.w;
    }
  }
};

template <int DMAX, typename Src>
__global__ __launch_bounds__(kAttnThreads) void AttentionKernel(const AttnParams p,
                                                                 const Src all_src) {
  constexpr int kCols = DMAX / kWarp;  // output columns per lane
  extern __shared__ float smem[];
  float* q_s = smem;                      // [16, DMAX]
  float* k_s = q_s + kQRows * DMAX;       // [32, DMAX + 1], padded: lane j reads row j
  float* v_s = k_s + kKeys * (DMAX + 1);  // [32, DMAX]
  const AttentionArgs& a = p.a;
  const int D = a.head_dim, G = p.group;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  // This block's sequence: the last one whose tiles begin at or before blockIdx.x.
  int first_seq = 0, last_seq = p.num_seqs - 1;
  while (first_seq < last_seq) {
    const int mid = (first_seq + last_seq + 1) / 2;
    if (p.seqs[mid].tile_begin <= blockIdx.x) {
      first_seq = mid;
    } else {
      last_seq = mid - 1;
    }
  }
  const SeqDesc sq = p.seqs[first_seq];
  const Src src = all_src.ForSeq(sq.table_offset);
  src.Prepare();  // made visible by the first barrier of the key loop
  const int64_t rows_total = sq.num_tokens * G;
  const int64_t qi0 = (static_cast<int64_t>(blockIdx.x) - sq.tile_begin) * kQRows;
  const float* q = a.q + sq.token_offset * a.num_heads * D;

  for (int idx = threadIdx.x; idx < kQRows * DMAX; idx += blockDim.x) {
    const int r = idx / DMAX, d = idx % DMAX;
    const int64_t qi = qi0 + r;
    float v = 0.f;
    if (qi < rows_total && d < D) {
      const int64_t t = qi / G;
      const int h = kvh * G + static_cast<int>(qi % G);
      v = q[(t * a.num_heads + h) * D + d];
    }
    q_s[idx] = v;
  }

  // Keys any row of this block may see, cut to this split's share.
  const int64_t t_lo = qi0 / G;
  const int64_t t_hi = Min64(sq.num_tokens - 1, (qi0 + kQRows - 1) / G);
  const int64_t first =
      a.sliding_window > 0 ? Max64(0, sq.start_pos + t_lo - a.sliding_window + 1) : 0;
  const int64_t s_begin = Max64(first, split * p.keys_per_split);
  const int64_t s_end = Min64(sq.start_pos + t_hi + 1, (split + 1) * p.keys_per_split);

  const bool warp_active = qi0 + warp * kRowsPerWarp < rows_total;
  bool valid[kRowsPerWarp];
  int64_t pos[kRowsPerWarp], lo[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    valid[r] = qi < rows_total;
    pos[r] = sq.start_pos + qi / G;
    lo[r] = a.sliding_window > 0 ? pos[r] - a.sliding_window + 1 : 0;
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < kCols; ++i) o[r][i] = 0.f;
  }

  for (int64_t s0 = s_begin; s0 < s_end; s0 += kKeys) {
    __syncthreads();  // q_s written / the previous tile consumed
    if (D % kChunk == 0 && src.ChunksAligned()) {
      // The tile's K and V in chunks of 8 consecutive elements (one 16-byte load of bf16, 8 bytes
      // of fp8, b bytes of TurboQuant codes, one block-table lookup), kChunkBatch chunks of each
      // per thread issued before any is stored, so that they are in flight together. (Element
      // by element, one latency each, decode at context 512 took 82 us a layer, H200, NOTES.md.)
      constexpr int kPerThread = kKeys * DMAX / kChunk / kAttnThreads, kChunkBatch = 2;
      static_assert(kPerThread % kChunkBatch == 0);
#pragma unroll
      for (int c = 0; c < kPerThread; c += kChunkBatch) {
        float kr[kChunkBatch][kChunk], vr[kChunkBatch][kChunk];
#pragma unroll
        for (int u = 0; u < kChunkBatch; ++u) {
          const int idx = (c + u) * kAttnThreads + static_cast<int>(threadIdx.x);
          const int j = idx / (DMAX / kChunk), d0 = idx % (DMAX / kChunk) * kChunk;
          if (s0 + j < s_end && d0 < D) {
            src.LoadChunk(s0 + j, kvh, d0, kr[u], vr[u]);
          } else {
#pragma unroll
            for (int e = 0; e < kChunk; ++e) kr[u][e] = vr[u][e] = 0.f;
          }
        }
#pragma unroll
        for (int u = 0; u < kChunkBatch; ++u) {
          const int idx = (c + u) * kAttnThreads + static_cast<int>(threadIdx.x);
          const int j = idx / (DMAX / kChunk), d0 = idx % (DMAX / kChunk) * kChunk;
#pragma unroll
          for (int e = 0; e < kChunk; ++e) {
            k_s[j * (DMAX + 1) + d0 + e] = kr[u][e];
            v_s[j * DMAX + d0 + e] = vr[u][e];
          }
        }
      }
    } else {  // head_dim not a multiple of 8: element by element
      for (int idx = threadIdx.x; idx < kKeys * DMAX; idx += kAttnThreads) {
        const int j = idx / DMAX, d = idx % DMAX;
        float kv = 0.f, vv = 0.f;
        if (s0 + j < s_end && d < D) src.Load(s0 + j, kvh, d, kv, vv);
        k_s[j * (DMAX + 1) + d] = kv;
        v_s[j * DMAX + d] = vv;
      }
    }
    __syncthreads();

    if (!warp_active) continue;  // warp-uniform: no query row here (decode fills 8 of 16)
    float sc[kRowsPerWarp] = {};  // q[row] . k[s0 + lane]
    const float* kr = k_s + lane * (DMAX + 1);
    const float* qw = q_s + warp * kRowsPerWarp * DMAX;
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
      const float kd = kr[d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) sc[r] = fmaf(qw[r * DMAX + d], kd, sc[r]);
    }
    const int64_t s = s0 + lane;
    float pr[kRowsPerWarp];  // this lane's key's weight for each row
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const bool ok = valid[r] && s < s_end && s <= pos[r] && s >= lo[r];
      const float score = ok ? sc[r] * a.scale : -INFINITY;
      const float m_new = fmaxf(m[r], WarpMax(score));
      pr[r] = 0.f;
      if (m_new == -INFINITY) continue;  // warp-uniform: no visible key yet
      const float corr = expf(m[r] - m_new);
      pr[r] = ok ? expf(score - m_new) : 0.f;
      l[r] = l[r] * corr + WarpSum(pr[r]);
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kCols; ++i) o[r][i] *= corr;
    }
    // Each value element read from shared memory once, for all the warp's rows.
    for (int j = 0; j < kKeys; ++j) {
      float vv[kCols];
#pragma unroll
      for (int i = 0; i < kCols; ++i) vv[i] = v_s[j * DMAX + lane + i * kWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float pj = __shfl_sync(0xffffffffu, pr[r], j);
#pragma unroll
        for (int i = 0; i < kCols; ++i) o[r][i] = fmaf(pj, vv[i], o[r][i]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (!valid[r]) continue;
    const int64_t qi = qi0 + warp * kRowsPerWarp + r;
    const int64_t row = (sq.token_offset + qi / G) * a.num_heads + kvh * G + qi % G;  // t NH + h
    if (p.num_splits == 1) {
      const float inv = 1.f / l[r];  // > 0: key pos[r] is always in range
#pragma unroll
      for (int i = 0; i < kCols; ++i) {
        const int d = lane + i * kWarp;
        if (d < D) a.out[row * D + d] = o[r][i] * inv;
      }
    } else {
      const int64_t prow = split * p.total_tokens * a.num_heads + row;
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
// The split weights e^(m_z - M) / den are computed once, in parallel, into shared memory.
__global__ void AttentionCombineKernel(const AttnParams p) {
  extern __shared__ float weight[];  // [splits]
  __shared__ float red[kWarp];
  const AttentionArgs& a = p.a;
  const int64_t row = blockIdx.x, rows = p.total_tokens * a.num_heads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  float M = -INFINITY;
  for (int z = threadIdx.x; z < p.num_splits; z += blockDim.x) {
    M = fmaxf(M, p.part_ml[(z * rows + row) * 2]);
  }
  M = WarpMax(M);
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = -INFINITY;
  for (int w = 0; w < warps; ++w) M = fmaxf(M, red[w]);
  __syncthreads();  // red is reused below
  float den = 0.f;
  for (int z = threadIdx.x; z < p.num_splits; z += blockDim.x) {
    const float mz = p.part_ml[(z * rows + row) * 2];
    const float e = mz == -INFINITY ? 0.f : expf(mz - M);
    weight[z] = e;
    den += e * p.part_ml[(z * rows + row) * 2 + 1];
  }
  den = WarpSum(den);
  if (lane == 0) red[warp] = den;
  __syncthreads();
  den = 0.f;
  for (int w = 0; w < warps; ++w) den += red[w];
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float num = 0.f;
    for (int z = 0; z < p.num_splits; ++z) {
      num = fmaf(weight[z], p.part_o[(z * rows + row) * a.head_dim + d], num);
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

// Plans the tiles of `seqs` (host memory; start_pos, num_tokens, token_offset and table_offset
// filled) and the split, copies the plan to the device through `stage`, reserves partials through
// `reserve`, launches the flash kernel reading `src` and, when split, the combine kernel. Shared
// by Attention (one sequence) and PagedAttention (a batch of sequences, one launch).
template <typename Src, typename Reserve, typename Stage>
void RunAttention(const AttentionArgs& a, std::vector<SeqDesc> seqs, const Src& src, int num_sms,
                  Reserve reserve, Stage stage, cudaStream_t stream) {
  AttnParams p;
  p.a = a;
  p.group = a.num_heads / a.num_kv_heads;
  int64_t tiles = 0, keys = 0;  // keys: the longest sequence's S
  for (SeqDesc& sq : seqs) {
    sq.tile_begin = tiles;
    tiles += CeilDiv(sq.num_tokens * p.group, kQRows);
    p.total_tokens += sq.num_tokens;
    keys = std::max(keys, sq.start_pos + sq.num_tokens);
  }
  if (tiles == 0) return;
  const int64_t blocks = tiles * a.num_kv_heads;
  // Flash-decoding: when the grid would leave SMs idle, split the keys so that about four blocks
  // run per SM, each split at least one tile of keys, at most kMaxSplits splits. Splits past a
  // shorter sequence's keys find nothing to do and leave an empty partial.
  const int64_t key_tiles = CeilDiv(keys, kKeys);
  int64_t per_split = key_tiles * kKeys;
  if (blocks < 4 * num_sms && key_tiles >= 2) {
    const int64_t want = std::min({CeilDiv(4 * num_sms, blocks), key_tiles, kMaxSplits});
    per_split = CeilDiv(key_tiles, want) * kKeys;  // whole tiles (rounding keys first doubled it)
  }
  p.keys_per_split = per_split;
  p.num_splits = static_cast<int>(CeilDiv(keys, per_split));
  MOE_CHECK(tiles <= 0x7fffffff && p.num_splits <= 65535)
      << "Attention: grid " << tiles << " x " << p.num_splits;
  p.num_seqs = static_cast<int>(seqs.size());
  p.seqs = static_cast<const SeqDesc*>(stage(seqs.data(), seqs.size() * sizeof(SeqDesc)));
  if (p.num_splits > 1) {
    const size_t rows = static_cast<size_t>(p.total_tokens) * a.num_heads;
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
    AttentionCombineKernel<<<static_cast<unsigned>(p.total_tokens * a.num_heads), 128,
                             p.num_splits * sizeof(float), stream>>>(p);
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
  cuda::SeqDesc sq;
  sq.start_pos = a.start_pos;
  sq.num_tokens = a.num_tokens;
  cuda::RunAttention(
      a, {sq}, src, num_sms_, [this](size_t bytes) { return Reserve(work_, bytes); },
      [this](const void* host, size_t bytes) { return StageHostArgs(args2_, host, bytes); },
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
};

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
  __device__ __forceinline__ bool ChunksAligned() const {
    const uint64_t any = reinterpret_cast<uintptr_t>(g.base) |
                         static_cast<uint64_t>(g.block_stride) | static_cast<uint64_t>(g.tile_bytes);
    return (any & (kFp8 ? 7 : 15)) == 0;
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

// A rejected vector as one number, smallest first by position: position << 16 | kv-head << 1 |
// role (kv-heads < 2^15).
__host__ __device__ __forceinline__ unsigned long long KvBadCode(int64_t pos, int h, int role) {
  return static_cast<unsigned long long>(pos) << 16 | static_cast<unsigned long long>(h) << 1 |
         static_cast<unsigned long long>(role);
}

// One block per (token, kv-head, role): checks finiteness, then bf16 bits or fp8 amax, scale and
// codes exactly as KvCodec::Quantize. A non-finite vector is not written; the smallest such
// (position, kv-head, role) goes to *bad (KvBadCode).
template <bool kFp8>
__global__ void PagedKvWriteKernel(PagedGeom g, const float* k, const float* v,
                                   const int2* where, unsigned long long* bad) {
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
    if (threadIdx.x == 0) atomicMin(bad, KvBadCode(where[t].y, h, role));
    return;
  }
  const int slot = where[t].x % g.block_size;
  uint8_t* tile = g.TileOfSlot(where[t].x, h, role);
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
                              const int2* where, unsigned long long* bad) {
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
    if (threadIdx.x == 0) atomicMin(bad, KvBadCode(where[t].y, h, role));
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
    if (threadIdx.x == 0) atomicMin(bad, KvBadCode(where[t].y, h, role));
    return;
  }
  const int slot = where[t].x % g.block_size;
  uint8_t* tile = g.TileOfSlot(where[t].x, h, role);
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
struct TqKvSource : PagedLoads<TqKvSource> {
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
  // The codebook in shared memory (Prepare, before the kernel's first barrier).
  __device__ __forceinline__ float* Centroids() const {
    __shared__ float centroids[256];
    return centroids;
  }
  __device__ __forceinline__ void Prepare() const {
    for (int i = threadIdx.x; i < (1 << tb.bits); i += blockDim.x) Centroids()[i] = tb.centroids[i];
  }
  // Tiles 4-byte aligned: b = 4 codes are one 32-bit load, b = 2 one 16-bit load, the fp16
  // scale one 16-bit load (head_dim a multiple of 8).
  __device__ __forceinline__ bool ChunksAligned() const {
    const uint64_t any = reinterpret_cast<uintptr_t>(g.base) |
                         static_cast<uint64_t>(g.block_stride) | static_cast<uint64_t>(g.tile_bytes);
    return (any & 3) == 0;
  }
  // Elements d0 .. d0 + 7: their 8 b-bit codes are the b bytes at b · d0 / 8 (byte aligned).
  __device__ __forceinline__ void Chunk(const uint8_t* tile, int slot, int d0,
                                        float (&out)[kChunk]) const {
    const int b = tb.bits, index_bytes = g.head_dim * b / 8;
    const uint8_t* codes = tile + static_cast<int64_t>(slot) * index_bytes + b * (d0 / 8);
    uint32_t w = 0;
    if (b == 4) {
      w = *reinterpret_cast<const uint32_t*>(codes);
    } else if (b == 2) {
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

namespace {

// True when the batch can be one launch: every element reads the same layer of the same cache
// and its rows (of k/v for a write, of q/out for attention) follow the previous element's.
bool SameLayer(const PagedKvLayer& a, const PagedKvLayer& b) {
  return b.layer_base == a.layer_base && b.block_stride == a.block_stride &&
         b.tile_bytes == a.tile_bytes && b.block_size == a.block_size && b.codecs == a.codecs &&
         b.num_kv_heads == a.num_kv_heads && b.head_dim == a.head_dim;
}

bool OneLaunch(absl::Span<const PagedKvWriteArgs> batch) {
  const PagedKvWriteArgs& a = batch[0];
  const int64_t row = static_cast<int64_t>(a.kv.num_kv_heads) * a.kv.head_dim;
  int64_t tokens = 0;
  for (const PagedKvWriteArgs& e : batch) {
    if (!SameLayer(a.kv, e.kv) || e.k != a.k + tokens * row || e.v != a.v + tokens * row) {
      return false;
    }
    tokens += e.num_tokens;
  }
  return true;
}

bool OneLaunch(absl::Span<const PagedAttentionArgs> batch) {
  const PagedAttentionArgs& a = batch[0];
  const int64_t row = static_cast<int64_t>(a.num_heads) * a.kv.head_dim;
  int64_t tokens = 0;
  for (const PagedAttentionArgs& e : batch) {
    if (!SameLayer(a.kv, e.kv) || e.num_heads != a.num_heads || e.scale != a.scale ||
        e.sliding_window != a.sliding_window || e.q != a.q + tokens * row ||
        e.out != a.out + tokens * row) {
      return false;
    }
    tokens += e.num_tokens;
  }
  return true;
}

}  // namespace

absl::Status CudaBackend::PagedKvWrite(absl::Span<const PagedKvWriteArgs> batch) {
  if (batch.empty()) return absl::OkStatus();
  const cuda::PagedPath path = cuda::ChoosePath(batch[0].kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedKvWrite(batch);  // split/prod formats
  if (batch.size() > 1 && !OneLaunch(batch)) {
    for (const PagedKvWriteArgs& a : batch) MOE_RETURN_IF_ERROR(PagedKvWrite({a}));
    return absl::OkStatus();
  }
  const PagedKvLayer& kv = batch[0].kv;
  // Each token's cache slot (block · block_size + slot) and position.
  std::vector<int2> where;
  for (const PagedKvWriteArgs& a : batch) {
    for (int64_t t = 0; t < a.num_tokens; ++t) {
      const int64_t pos = a.start_pos + t;
      MOE_CHECK(pos <= 0x7fffffff) << "PagedKvWrite: position " << pos;
      where.push_back(make_int2(a.kv.block_table[pos / kv.block_size] * kv.block_size +
                                    static_cast<int32_t>(pos % kv.block_size),
                                static_cast<int32_t>(pos)));
    }
  }
  if (where.empty()) return absl::OkStatus();
  MOE_CHECK(static_cast<int64_t>(where.size()) <= 0x7fffffff) << "PagedKvWrite: too many tokens";
  cuda::PagedGeom g{kv.layer_base, kv.block_stride, kv.tile_bytes, kv.block_size,
                    kv.num_kv_heads, kv.head_dim, nullptr};
  const auto* dev_where = static_cast<const int2*>(
      StageHostArgs(args_, where.data(), where.size() * sizeof(int2)));
  if (kv_verdict_ == nullptr) {
    MOE_CUDA_CHECK(cudaMalloc(&kv_verdict_, sizeof(unsigned long long)));
    MOE_CUDA_CHECK(cudaMemsetAsync(kv_verdict_, 0xff, sizeof(unsigned long long), stream_));
  }
  kv_verdict_pending_ = true;
  kv_verdict_format_ = kv.codecs[0]->format();
  const dim3 grid(static_cast<unsigned>(where.size()), static_cast<unsigned>(kv.num_kv_heads), 2);
  const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
  const float* k = batch[0].k;
  const float* v = batch[0].v;
  if (path == cuda::PagedPath::kFp8) {
    cuda::PagedKvWriteKernel<true><<<grid, threads, 0, stream_>>>(g, k, v, dev_where, kv_verdict_);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::PagedKvWriteKernel<false><<<grid, threads, 0, stream_>>>(g, k, v, dev_where, kv_verdict_);
  } else {
    const std::vector<float> host = cuda::TqHostTables(kv);
    const float* dev = static_cast<const float*>(
        StageHostArgs(paged_, host.data(), host.size() * sizeof(float)));
    const size_t smem = kv.head_dim * (sizeof(float) + 1);
    cuda::TqWriteKernel<<<grid, threads, smem, stream_>>>(g, cuda::TqDeviceTables(kv, dev), k, v,
                                                          dev_where, kv_verdict_);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
  return absl::OkStatus();  // the verdict: TakeKvWriteError
}

absl::Status CudaBackend::TakeKvWriteError() {
  if (!kv_verdict_pending_) return absl::OkStatus();
  kv_verdict_pending_ = false;
  unsigned long long code = 0;
  CopyToHost(&code, kv_verdict_, sizeof(code));
  if (code == ~0ull) return absl::OkStatus();
  MOE_CUDA_CHECK(cudaMemsetAsync(kv_verdict_, 0xff, sizeof(unsigned long long), stream_));
  return absl::InvalidArgumentError(absl::StrCat(
      "KV write at position ", code >> 16, ", kv-head ", (code >> 1) & 0x7fff,
      code % 2 == 0 ? " key: " : " value: ", "KV ", KvFormatName(kv_verdict_format_),
      " quantization: the vector has a non-finite element or its scale exceeds the fp16 range "
      "(not written)"));
}

absl::Status CudaBackend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  if (batch.empty()) return absl::OkStatus();
  const cuda::PagedPath path = cuda::ChoosePath(batch[0].kv);
  if (path == cuda::PagedPath::kHost) return Backend::PagedAttention(batch);  // split/prod formats
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
  int64_t tokens = 0;
  for (const PagedAttentionArgs& e : batch) {
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
      StageHostArgs(args_, tables.data(), tables.size() * sizeof(int32_t)));
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
    return StageHostArgs(args2_, host, bytes);
  };
  if (path == cuda::PagedPath::kFp8) {
    cuda::RunAttention(c, std::move(seqs), cuda::PagedKvSource<true>{{}, g}, num_sms_, reserve,
                       stage, stream_);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::RunAttention(c, std::move(seqs), cuda::PagedKvSource<false>{{}, g}, num_sms_, reserve,
                       stage, stream_);
  } else {
    // Rotated frame: q' = Π_K q, attention over s · C[idx], out = Πᵀ_V acc.
    const std::vector<float> host = cuda::TqHostTables(kv);
    const size_t rows = static_cast<size_t>(tokens) * a.num_heads;
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
    cuda::RunAttention(c, std::move(seqs), cuda::TqKvSource{{}, g, tb}, num_sms_, reserve,
                       stage, stream_);
    cuda::TqRotateKernel<<<static_cast<unsigned>(rows), threads, smem, stream_>>>(
        a.out, o_rot, tb, a.num_heads, group, kv.head_dim, false);
    MOE_CUDA_CHECK(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace moe::kernels
