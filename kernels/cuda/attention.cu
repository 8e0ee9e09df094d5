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
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/step_graph.cuh"

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
  // The kernel writes partials (part_o, part_ml) and a combine kernel the output: when split, and
  // always for a source whose combine also rotates the output back (kCombineRotates).
  bool partials = false;
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
  static constexpr bool kCombineRotates = false;  // see TqSplitKvSource
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
  WaitForPriorKernel();
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
    if (!p.partials) {
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

// The combine's split weights e^(m_z - M), M = max_z m_z, of `row` into weight[z] (shared
// memory), computed once, in parallel; returns their denominator sum_z e^(m_z - M) l_z. Called by
// every thread of the block (red: kWarp floats of shared scratch); weight is ready on return.
__device__ __forceinline__ float CombineWeights(const AttnParams& p, int64_t row, float* weight,
                                                float* red) {
  const int64_t rows = p.total_tokens * p.a.num_heads;
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
  return den;
}

// out[row] = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z. Block (row, 32 dims): the weights
// (CombineWeights), then the 4 warps take every 4th split (lane = dim) and add up in shared memory.
constexpr int kCombineWarps = 4;
__global__ void AttentionCombineKernel(const AttnParams p) {
  WaitForPriorKernel();
  extern __shared__ float weight[];  // [splits]
  __shared__ float red[kWarp];
  __shared__ float acc[kCombineWarps][kWarp];
  const AttentionArgs& a = p.a;
  const int64_t row = blockIdx.x, rows = p.total_tokens * a.num_heads;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const float den = CombineWeights(p, row, weight, red);
  const int d = blockIdx.y * kWarp + lane;
  float num = 0.f;
  if (d < a.head_dim) {
#pragma unroll 4
    for (int z = warp; z < p.num_splits; z += kCombineWarps) {
      num = fmaf(weight[z], p.part_o[(z * rows + row) * a.head_dim + d], num);
    }
  }
  acc[warp][lane] = num;
  __syncthreads();
  if (warp == 0 && d < a.head_dim) {
    num = 0.f;
    for (int w = 0; w < kCombineWarps; ++w) num += acc[w][lane];
    a.out[row * a.head_dim + d] = num / den;
  }
}

// The combine kernel over `p`'s partials (p.partials).
void LaunchCombine(const AttnParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.total_tokens * p.a.num_heads),
                  static_cast<unsigned>(CeilDiv(p.a.head_dim, kWarp)));
  Launch(AttentionCombineKernel, grid, kCombineWarps * kWarp, p.num_splits * sizeof(float),
         stream, p);
}

// The combine of `p`'s partials for a kernel reading `src`: the source's own where it has one.
template <typename Src>
void LaunchCombine(const AttnParams& p, const Src& src, cudaStream_t stream) {
  if constexpr (Src::kCombineRotates) {
    src.LaunchCombine(p, stream);
  } else {
    LaunchCombine(p, stream);
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
  Launch(AttentionKernel<DMAX, Src>, grid, kAttnThreads, smem, stream, p, src);
}

}  // namespace

// The launch's device tables, once p.num_splits and p.total_tokens are set: the sequences
// through `stage`, and when split the partials (o, then m and l) of every split from `reserve`.
template <typename Reserve, typename Stage>
void StageSeqsAndPartials(AttnParams& p, const std::vector<SeqDesc>& seqs, Reserve reserve,
                          Stage stage) {
  p.num_seqs = static_cast<int>(seqs.size());
  p.seqs = static_cast<const SeqDesc*>(stage(seqs.data(), seqs.size() * sizeof(SeqDesc)));
  if (p.partials) {
    const size_t rows = static_cast<size_t>(p.total_tokens) * p.a.num_heads;
    const size_t floats = static_cast<size_t>(p.num_splits) * rows * (p.a.head_dim + 2);
    p.part_o = static_cast<float*>(reserve(floats * sizeof(float)));
    p.part_ml = p.part_o + static_cast<size_t>(p.num_splits) * rows * p.a.head_dim;
  }
}

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
  p.partials = p.num_splits > 1 || Src::kCombineRotates;
  MOE_CHECK(tiles <= 0x7fffffff && p.num_splits <= 65535)
      << "Attention: grid " << tiles << " x " << p.num_splits;
  StageSeqsAndPartials(p, seqs, reserve, stage);
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(p.num_splits));
  if (a.head_dim <= 64) {
    LaunchAttention<64>(p, src, grid, stream);
  } else if (a.head_dim <= 128) {
    LaunchAttention<128>(p, src, grid, stream);
  } else {
    LaunchAttention<256>(p, src, grid, stream);
  }
  if (p.partials) LaunchCombine(p, src, stream);
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

// ---- Paged KV cache: bf16 and fp8-e4m3 tiles (engine/kv_storage.h, kernels/kvcodec/kv_quant.h) --------
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
  WaitForPriorKernel();
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

// KvCodec::Quantize for a single-part MSE format, one warp per (token, kv-head, K|V): n =
// sqrt(Σ x_j² ascending), u = x / n, y = Π u, idx = #boundaries <= y, scale, fp16 scale; indices
// packed b bits each, little-endian; scale plane after the index plane. Lane holds elements
// lane + 32k; everything it reads is loaded up front; the sum of squares is one lane's, in the
// CPU's order. (One block of D threads with block barriers between the steps, a run-time b and
// one thread summing from shared memory took 5.5 us for one token's 8 vectors, H200.)
template <int D, int kBits>  // g.head_dim, tb.bits
__global__ __launch_bounds__(kWarp) void TqWriteKernel(PagedGeom g, TqTables tb, const float* k,
                                                       const float* v, const int2* where,
                                                       unsigned long long* bad) {
  WaitForPriorKernel();
  constexpr int b = kBits, kPer = D / kWarp, kLevels = 1 << kBits, kIndexBytes = D * kBits / 8;
  __shared__ __align__(16) float squares[D];
  __shared__ uint8_t idx[D];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, lane = threadIdx.x;
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * D;
  const int2 at = where[t];
  float y[kPer], d1[kPer], d2[kPer], bounds[kLevels - 1];
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    y[e] = x[lane + kWarp * e];
    d1[e] = tb.D1(h, role, D)[lane + kWarp * e];
    d2[e] = tb.D2(h, role, D)[lane + kWarp * e];
  }
#pragma unroll
  for (int i = 0; i < kLevels - 1; ++i) bounds[i] = tb.boundaries[i];
  bool finite = true;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    finite = finite && isfinite(y[e]);
    squares[lane + kWarp * e] = __fmul_rn(y[e], y[e]);
  }
  if (!__all_sync(0xffffffffu, finite)) {
    if (lane == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  __syncwarp();
  float n = 0.f;
  if (lane == 0) {
    const float4* sq4 = reinterpret_cast<const float4*>(squares);
    float n2 = 0.f;
#pragma unroll
    for (int i = 0; i < D / 4; ++i) {
      const float4 q = sq4[i];
      n2 = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(n2, q.x), q.y), q.z), q.w);
    }
    n = __fsqrt_rn(n2);
  }
  n = __shfl_sync(0xffffffffu, n, 0);
  if (n != 0.f) {  // warp-uniform; n == 0: zero indices and scale
#pragma unroll
    for (int e = 0; e < kPer; ++e) y[e] = __fdiv_rn(y[e], n);
    WarpRht2<D>(y, d1, d2, true);
  }
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    int c = 0;
    if (n != 0.f) {
#pragma unroll
      for (int i = 0; i < kLevels - 1; ++i) c += bounds[i] <= y[e] ? 1 : 0;
    }
    idx[lane + kWarp * e] = static_cast<uint8_t>(c);
  }
  __syncwarp();
  float s = 0.f;
  if (lane == 0 && n != 0.f) {
    if (tb.norm == static_cast<int>(TqNorm::kPlain)) {
      s = n;
    } else if (tb.norm == static_cast<int>(TqNorm::kDebiased)) {
      s = __fdiv_rn(n, tb.alpha);
    } else {
      float e2 = 0.f;
      for (int i = 0; i < D; ++i) {
        const float c = tb.centroids[idx[i]];
        e2 = __fadd_rn(e2, __fmul_rn(c, c));
      }
      s = e2 > 0.f ? __fdiv_rn(n, __fsqrt_rn(e2)) : 0.f;
    }
  }
  s = __shfl_sync(0xffffffffu, s, 0);
  if (!(s <= 65504.f)) {
    if (lane == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const int slot = at.x % g.block_size;
  uint8_t* tile = g.TileOfSlot(at.x, h, role);
  for (int j = lane; j < kIndexBytes; j += kWarp) {
    uint32_t out = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int bit = j * 8 + i;
      out |= ((static_cast<uint32_t>(idx[bit / b]) >> (bit % b)) & 1u) << i;
    }
    tile[static_cast<int64_t>(slot) * kIndexBytes + j] = static_cast<uint8_t>(out);
  }
  if (lane == 0) {
    const uint16_t hb = F32ToF16Bits(s);
    uint8_t* sp = tile + static_cast<int64_t>(g.block_size) * kIndexBytes + 2 * slot;
    sp[0] = static_cast<uint8_t>(hb & 0xff);
    sp[1] = static_cast<uint8_t>(hb >> 8);
  }
}

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

// KvCodec::Quantize for a split format: one block of 128 threads per (token, kv-head, K|V); thread
// t owns rotated position t (t < 32 the outlier part, the first warp; the rest the other three).
template <int kBitsO, int kBitsR>
__global__ __launch_bounds__(kSplitD) void TqSplitWriteKernel(PagedGeom g, TqSplitTables tb,
                                                              const float* k, const float* v,
                                                              const int2* where,
                                                              unsigned long long* bad) {
  using Planes = SplitPlanes<kBitsO, kBitsR>;
  extern __shared__ __align__(16) float haar_t_s[];  // Π_Rᵀ [96 · 96]
  __shared__ float x_s[kSplitD], u_s[kSplitD], norms[2], scales[2];
  __shared__ uint8_t idx[kSplitD];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y, role = blockIdx.z, p = threadIdx.x;
  const bool outlier = p < kSplitO;
  const int part = outlier ? 0 : 1;
  // The constant tables before the wait: loaded while the kernel before runs.
  StageSplitMatrix(haar_t_s, tb.HaarT(h, role));
  const int channel = tb.Channel(h, role, p);
  const SplitSigns signs = LoadSplitSigns(tb, h, role);
  constexpr int kMaxBounds = (1 << (kBitsO > kBitsR ? kBitsO : kBitsR)) - 1;
  const int num_bounds = (outlier ? 1 << kBitsO : 1 << kBitsR) - 1;
  float bounds[kMaxBounds];
#pragma unroll
  for (int i = 0; i < kMaxBounds; ++i) {
    bounds[i] = i < num_bounds ? (outlier ? tb.boundaries_o : tb.boundaries_r)[i] : INFINITY;
  }
  WaitForPriorKernel();
  const float* x = (role == 0 ? k : v) + (t * g.num_kv_heads + h) * kSplitD;
  const int2 at = where[t];
  x_s[p] = x[p];
  if (!__syncthreads_and(isfinite(x_s[p]))) {
    if (p == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const float gathered = x_s[channel];
  u_s[p] = gathered;
  __syncthreads();
  // n = sqrt(Σ x_c² over the part's channels, ascending); loops of fixed length, so that the
  // loads go out ahead of the adds.
  auto sum_squares = [&](auto begin, auto end) {
    float n2 = 0.f;
#pragma unroll
    for (int j = decltype(begin)::value; j < decltype(end)::value; ++j) {
      n2 = __fadd_rn(n2, __fmul_rn(u_s[j], u_s[j]));
    }
    return __fsqrt_rn(n2);
  };
  if (p == 0) norms[0] = sum_squares(std::integral_constant<int, 0>{},
                                     std::integral_constant<int, kSplitO>{});
  if (p == kSplitO) norms[1] = sum_squares(std::integral_constant<int, kSplitO>{},
                                           std::integral_constant<int, kSplitD>{});
  __syncthreads();
  const float n = norms[part];
  u_s[p] = n != 0.f ? __fdiv_rn(gathered, n) : 0.f;
  __syncthreads();
  int c = 0;
  if (n != 0.f) {  // warp-uniform
    const float y = SplitRotatePosition(haar_t_s, u_s, signs, true);
#pragma unroll
    for (int i = 0; i < kMaxBounds; ++i) c += bounds[i] <= y ? 1 : 0;  // +inf past the part's
  }
  idx[p] = static_cast<uint8_t>(c);
  __syncthreads();
  if (p == 0 || p == kSplitO) {
    const float alpha = outlier ? tb.alpha_o : tb.alpha_r;
    float s = 0.f;
    if (n != 0.f) {
      if (tb.norm == static_cast<int>(TqNorm::kPlain)) {
        s = n;
      } else if (tb.norm == static_cast<int>(TqNorm::kDebiased)) {
        s = __fdiv_rn(n, alpha);
      } else {
        const float* centroids = outlier ? tb.centroids_o : tb.centroids_r;
        const int end = outlier ? kSplitO : kSplitD;
        float e2 = 0.f;
        for (int j = p; j < end; ++j) {
          const float cj = centroids[idx[j]];
          e2 = __fadd_rn(e2, __fmul_rn(cj, cj));
        }
        s = e2 > 0.f ? __fdiv_rn(n, __fsqrt_rn(e2)) : 0.f;
      }
    }
    scales[part] = s;
  }
  __syncthreads();
  if (!(scales[0] <= 65504.f && scales[1] <= 65504.f)) {
    if (p == 0) atomicMin(bad, KvBadCode(at.y, h, role));
    return;
  }
  const int slot = at.x % g.block_size, bs = g.block_size;
  uint8_t* tile = g.TileOfSlot(at.x, h, role);
  // Byte j of a part's index plane: bits 8j .. 8j + 7, index i at bit offset b · i.
  auto pack = [&](int first, int b, int j) {
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i) {
      const int bit = j * 8 + i;
      out |= ((static_cast<uint32_t>(idx[first + bit / b]) >> (bit % b)) & 1u) << i;
    }
    return static_cast<uint8_t>(out);
  };
  if (p < Planes::kBytesO) tile[Planes::IndexO(bs, slot) + p] = pack(0, kBitsO, p);
  if (p >= kSplitO && p - kSplitO < Planes::kBytesR) {
    tile[Planes::IndexR(bs, slot) + (p - kSplitO)] = pack(kSplitO, kBitsR, p - kSplitO);
  }
  if (p == 0 || p == kSplitO) {
    const uint16_t hb = F32ToF16Bits(scales[part]);
    uint8_t* sp = tile + (outlier ? Planes::ScaleO(bs, slot) : Planes::ScaleR(bs, slot));
    sp[0] = static_cast<uint8_t>(hb & 0xff);
    sp[1] = static_cast<uint8_t>(hb >> 8);
  }
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


// ---- Decode attention on the tensor cores -----------------------------------------------------
// One query token per sequence (a decode step). The G query heads of a kv head are a dimension
// of mma.sync m16n8k16 tiles (bf16 operands, fp32 accumulation), so the score and value products
// run on the tensor cores and the kernel can go at the speed of its loads; the SIMT kernel above
// is latency-bound at long contexts (NOTES.md). Block (sequence, kv head, split) of the source's
// warps (DecodeWarps); each warp takes the split's 16-key tiles in turn, loading the next tile
// while it computes this one, with an online softmax of its own; the block merges its warps at
// the end (and the combine kernel the splits, as above). One block per SM where the registers
// allow: the more warps a block has, the fewer splits the combine kernel reads (it went 5.9 ->
// 8.2 us a layer at 32k from 33 splits to 132).
// Per tile, lane (g = lane / 4, t = lane % 4) loads keys g and 8 + g at dims [t D/4, (t+1) D/4)
// (Sᵀ = K Qᵀ takes the dims in that order: a dot product does not care), and the values of
// keys 2t, 2t+1, 8+2t, 9+2t at dims [g D/8, (g+1) D/8), each in the widest loads its bytes
// allow. Sᵀ = K Qᵀ has the 16 keys as M and the query rows as N, Oᵀ = Vᵀ Pᵀ the dims as M and the
// rows as N, so no operand is padding (with S = Q Kᵀ, 8 of 16 rows were, and assembling them
// cost more instructions than the products); the lane's weights become the Pᵀ operand by one
// movmatrix transpose per 8 x 8. Operands not exact in bf16 are split (DecodeBf16Parts): against
// bf16 and fp8 elements (exact) q and P into hi + mid + lo bf16 (fp32's 24 bits); the TurboQuant
// centroids into hi + lo and q and P into hi + mid (16 bits each; lo meets q's and P's hi only).
// TurboQuant: the block rotates its queries into the cache's frame and its (partial) outputs
// back, one warp a vector; the rotation is linear, so the combine of rotated partials is the
// rotated combine. (The split formats rotate in kernels of their own: TqSplitKvSource.)
constexpr int kTileKeys = 16;

// Warps of DecodeAttentionKernel<D, kRows, Src>: the source's number where its registers fit
// 128 a thread (up to 8 rows of head_dim 128); 4 with up to 255 registers for larger tiles.
template <int D, int kRows, typename Src>
__host__ __device__ constexpr int DecodeWarps() {
  return D * kRows <= 1024 ? Src::kDecodeWarps : 4;
}

// The transpose of an 8 x 8 bf16 matrix held as mma fragments (lane: row lane / 4, columns
// 2 (lane % 4) and + 1): the same lane's fragment of the transposed matrix.
__device__ __forceinline__ uint32_t TransposeBf16x8x8(uint32_t x) {
  uint32_t y;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// (x, y) as N bf16 pairs (x in the low halves): hi + mid + lo = (x, y) to 2^-24, fp32's
// precision; hi + mid to 2^-16.
template <int N>
__device__ __forceinline__ void SplitBf16(float x, float y, uint32_t (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    const float2 hf = __bfloat1622float2(h);
    out[i] = *reinterpret_cast<const uint32_t*>(&h);
    x -= hf.x, y -= hf.y;  // exact
  }
}

// Parts q and P are split into: hi + mid + lo (fp32's 24 bits) against elements exact in bf16;
// hi + mid (16 bits) against the TurboQuant centroids, themselves carried at 16 bits (hi + lo),
// whose products already omit mid · lo, a term of the size lo · hi would add (2^-16 relative).
template <typename Src>
__host__ __device__ constexpr int DecodeBf16Parts() {
  return Src::kLowHalf ? 2 : 3;
}

// Words of one lane's Qᵀ fragment per k-step: b0, b1 of each 8-row tile, as hi, mid[, lo].
template <int kRows, typename Src>
__host__ __device__ constexpr int DecodeQWords() {
  return DecodeBf16Parts<Src>() * kRows / 4;
}

// Q fragments [D / 16][32 lanes][words], the merge: o [warps][kRows][D + 1], m, l, then the
// block's rows [kRows][D] (its queries, later its outputs) and their merge denominators [kRows].
template <int D, int kRows, typename Src>
constexpr size_t DecodeSmemBytes() {
  constexpr int kWarps = DecodeWarps<D, kRows, Src>();
  return sizeof(uint32_t) * (D / 16) * kWarp * DecodeQWords<kRows, Src>() +
         sizeof(float) * kWarps * kRows * (D + 3) + sizeof(float) * kRows * (D + 1);
}

// The kBytes bytes at p as little-endian words (w zero beyond them), in the widest loads that
// kBytes allows (p aligned to them: DecodeAligned).
template <int kBytes>
__device__ __forceinline__ void LoadBytes(const uint8_t* p, uint32_t (&w)[(kBytes + 3) / 4]) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      const uint4 x = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = x.x, w[4 * i + 1] = x.y, w[4 * i + 2] = x.z, w[4 * i + 3] = x.w;
    }
  } else if constexpr (kBytes % 8 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 8; ++i) {
      const uint2 x = reinterpret_cast<const uint2*>(p)[i];
      w[2 * i] = x.x, w[2 * i + 1] = x.y;
    }
  } else if constexpr (kBytes % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) w[i] = reinterpret_cast<const uint32_t*>(p)[i];
  } else if constexpr (kBytes % 2 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 2; ++i) {
      w[i / 2] |= uint32_t{reinterpret_cast<const uint16_t*>(p)[i]} << (16 * (i % 2));
    }
  } else {
#pragma unroll
    for (int i = 0; i < kBytes; ++i) w[i / 4] |= uint32_t{p[i]} << (8 * (i % 4));
  }
}

// Words a lane loads of one key and of one value of a tile: the one-part sources' chunk bytes
// (LoadBytes), the split formats' words that hold its fields.
template <int D, typename Src>
__host__ __device__ constexpr int DecodeKeyWords() {
  if constexpr (Src::kParts == 1) {
    return (D / 32 * Src::kChunkBytes + 3) / 4;
  } else {
    return Src::kKeyWords;
  }
}
template <int D, typename Src>
__host__ __device__ constexpr int DecodeValueWords() {
  if constexpr (Src::kParts == 1) {
    return (D / 64 * Src::kChunkBytes + 3) / 4;
  } else {
    return Src::kValueWords;
  }
}

// What a lane loads of one 16-key tile (see above), as loaded: the words of its two keys and of
// its four values, and the key and value scales of its two keys (g and 8 + g: their scores are
// its own). Nothing here reads what it loads of the tile (only the block-table entry that
// addresses it): the first instruction to read a load's register waits for it, so
// DecodeTile::Unpack reads them only when the tile's turn comes (a shift of each word just loaded
// made the split formats' decode wait on every next tile: 23% of its time, NOTES.md).
template <int D, typename Src>
struct DecodeLoads {
  uint32_t k[2][DecodeKeyWords<D, Src>()], v[4][DecodeValueWords<D, Src>()];
  uint32_t k_scale[Src::kParts][2], v_scale[Src::kParts][2];

  // Block-table entry and slot of position s0 + j, j < 16, from those of s0 (one division a
  // tile, not one per key).
  struct Place {
    int32_t block, slot;
  };
  __device__ __forceinline__ static Place PlaceOf(Place p0, int j, int block_size) {
    Place p{p0.block, p0.slot + j};
    while (p.slot >= block_size) p.slot -= block_size, ++p.block;
    return p;
  }

  // Keys s0 + j in [s_begin, s_end) only (the others: zero words). s0 is a multiple of 16: with
  // blocks of a multiple of 16 positions the tile lies in one block, one table lookup.
  __device__ __forceinline__ void Load(const Src& src, int kvh, int s0, int s_begin, int s_end,
                                       int g, int t) {
    const int bs = src.g.block_size;
    const Place p0{s0 / bs, s0 % bs};
    const bool one_block = bs % kTileKeys == 0;
    const uint8_t* block_tile = one_block ? src.g.TileOfBlock(p0.block, kvh, 0) : nullptr;
    auto key_tile = [&](int j, int& slot) {
      if (one_block) {
        slot = p0.slot + j;
        return block_tile;
      }
      const Place at = PlaceOf(p0, j, bs);
      slot = at.slot;
      return src.g.TileOfBlock(at.block, kvh, 0);
    };
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int j = 8 * n + g;
      const bool ok = s0 + j >= s_begin && s0 + j < s_end;
      int slot = 0;
      const uint8_t* tile = ok ? key_tile(j, slot) : nullptr;
      if constexpr (Src::kParts == 1) {
        constexpr int kKBytes = D / 32 * Src::kChunkBytes;
        for (uint32_t& w : k[n]) w = 0;
        if (ok) LoadBytes<kKBytes>(src.ChunkPtr(tile, slot, t * (D / 4)), k[n]);
      } else {
        src.KeyLoad(tile, slot, t, k[n]);
      }
#pragma unroll
      for (int part = 0; part < Src::kParts; ++part) {
        k_scale[part][n] = ok ? src.ScaleBits(tile, slot, part) : 0u;
        v_scale[part][n] = ok ? src.ScaleBits(tile + src.g.tile_bytes, slot, part) : 0u;
      }
    }
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4) {
      const int j = 2 * t + (c4 & 1) + 8 * (c4 >> 1);
      const bool ok = s0 + j >= s_begin && s0 + j < s_end;
      int slot = 0;
      const uint8_t* vtile = ok ? key_tile(j, slot) + src.g.tile_bytes : nullptr;
      if constexpr (Src::kParts == 1) {
        constexpr int kVBytes = D / 64 * Src::kChunkBytes;
        for (uint32_t& w : v[c4]) w = 0;
        if (ok) LoadBytes<kVBytes>(src.ChunkPtr(vtile, slot, g * (D / 8)), v[c4]);
      } else {
        src.ValueLoad(vtile, slot, g, v[c4]);
      }
    }
  }
};

// A tile as the products take it: raw chunks of the lane's two keys and four values, and their
// scales.
template <int D, typename Src>
struct DecodeTile {
  static constexpr int kKChunks = D / 32, kVChunks = D / 64;
  typename Src::Raw k[2][kKChunks];
  typename Src::RawV v[4][kVChunks];
  float k_scale[Src::kParts][2], v_scale[Src::kParts][2];

  __device__ __forceinline__ void Unpack(const DecodeLoads<D, Src>& l, int g, int t) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      if constexpr (Src::kParts == 1) {
        Src::SplitChunks(l.k[n], k[n]);
      } else {
        Src::KeyUnpack(l.k[n], t, k[n]);
      }
#pragma unroll
      for (int part = 0; part < Src::kParts; ++part) {
        k_scale[part][n] = Src::ScaleOf(l.k_scale[part][n]);
        v_scale[part][n] = Src::ScaleOf(l.v_scale[part][n]);
      }
    }
#pragma unroll
    for (int c4 = 0; c4 < 4; ++c4) {
      if constexpr (Src::kParts == 1) {
        Src::SplitChunks(l.v[c4], v[c4]);
      } else {
        Src::ValueUnpack(l.v[c4], g, v[c4]);
      }
    }
  }
};

// kRows: 8 (G <= 8) or 16 (G <= 16) query rows per block.
template <int D, int kRows, typename Src>
__global__ __launch_bounds__(DecodeWarps<D, kRows, Src>() * kWarp, 1)
    void DecodeAttentionKernel(const AttnParams p, const Src all_src) {
  // Nothing of the cache is read before the wait, not even positions before the block's first
  // token: a prefix block that a sequence admitted this step reuses may be one that this step's
  // KV write fills (engine/kv_cache.h, "Ordering contract").
  WaitForPriorKernel();
  constexpr int kDecodeWarps = DecodeWarps<D, kRows, Src>();
  constexpr int kSteps = D / 16;          // k-steps of Sᵀ = K Qᵀ
  constexpr int kKChunks = D / 32;        // chunks a lane loads of each of its two keys
  constexpr int kMTiles = D / 16;         // m-tiles of Oᵀ: dims g·D/8 + j and g·D/8 + D/16 + j
  constexpr int kRowTiles = kRows / 8;    // n-tiles of Sᵀ and Oᵀ: 8 query rows each
  extern __shared__ float dsmem[];
  const AttentionArgs& a = p.a;
  const SeqDesc sq = p.seqs[blockIdx.x];
  if (sq.num_tokens == 0) return;  // block-uniform
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, g = lane / 4, t = lane % 4;
  const int kvh = blockIdx.y, split = blockIdx.z, G = p.group;
  const Src src = all_src.ForSeq(sq.table_offset);
  src.Prepare();  // read after the barriers below
  // The block's rows: its nt tokens (consecutive positions) x the kv head's G query heads; row r
  // is head r % G of token r / G. Keys up to the last token's position, each row masked to its own.
  const int nt = static_cast<int>(sq.num_tokens), rows = nt * G;
  // Positions in 32 bits (DecodeAttention checks they fit): a tile compares and offsets ~20 of
  // them, and 64-bit ones cost two instructions each.
  const int start = static_cast<int>(sq.start_pos), pos = start + nt - 1;
  const int window = static_cast<int>(Min64(a.sliding_window, start + 1));  // 0: none
  const int first = window > 0 ? start + 1 - window : 0;
  const int s_begin = max(first, split * static_cast<int>(p.keys_per_split));
  const int s_end = min(pos + 1, (split + 1) * static_cast<int>(p.keys_per_split));
  // The token (of the block's) of each row this lane's scores belong to: rows 8r + 2t + i.
  int row_token[kRowTiles][2];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 8 * r + 2 * t + i;
      row_token[r][i] = row < rows ? row / G : nt - 1;  // padding rows: any token's keys
    }
  }

  // The next tile's loads go out before this tile's math when both fit the registers (the raw
  // bytes of a bf16 tile at head_dim 256 do not); the first tile's before the queries are
  // staged, so that its latency and theirs overlap.
  constexpr bool kPrefetch = sizeof(DecodeTile<D, Src>) <= 320;
  DecodeLoads<D, Src> next;
  DecodeTile<D, Src> cur;
  int s0 = s_begin / kTileKeys * kTileKeys + kTileKeys * warp;  // tiles at multiples of 16
  if (kPrefetch && s0 < s_end) next.Load(src, kvh, s0, s_begin, s_end, g, t);

  // Qᵀ as the B operand of every k-step, in shared memory (registers go to the loads in flight):
  // row tile r's b0 (slots 2t, 2t+1 of row 8r + g) and b1 (slots 2t+8, 2t+9); slot pair
  // (2t | 2t+8) + j of k-step 2i + h is dim 8 (t D/32 + i) + 4h + 2j, matching the key chunks.
  constexpr int kBf16Parts = DecodeBf16Parts<Src>();  // of q and P
  constexpr int kQWords = DecodeQWords<kRows, Src>();
  uint32_t* q_s = reinterpret_cast<uint32_t*>(dsmem);  // [kSteps][lane][kQWords]
  float* o_s = dsmem + kSteps * kWarp * kQWords;       // the merge: [warp][row][D + 1]
  float* m_s = o_s + kDecodeWarps * kRows * (D + 1);   // [warp][row]
  float* l_s = m_s + kDecodeWarps * kRows;
  float* rows_s = l_s + kDecodeWarps * kRows;          // [rows][D]
  float* row_den_s = rows_s + kRows * D;               // [row]: the merge's denominator
  {
    for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
      const int r = i / D;
      rows_s[i] = a.q[((sq.token_offset + r / G) * a.num_heads + kvh * G + r % G) * D + i % D];
    }
    __syncthreads();
    src.template RotateQuery<D>(rows_s, rows, kvh);
    __syncthreads();
    for (int kk = warp; kk < kSteps; kk += kDecodeWarps) {
      uint32_t* dst = q_s + (kk * kWarp + lane) * kQWords;
#pragma unroll
      for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int row = g + 8 * r;
          const int d = Src::template KeyChunkDim<D>(t, kk / 2) + 4 * (kk % 2) + 2 * j;
          float x = 0.f, y = 0.f;
          if (row < rows) x = rows_s[row * D + d], y = rows_s[row * D + d + 1];
          uint32_t parts[kBf16Parts];
          SplitBf16(x, y, parts);
#pragma unroll
          for (int u = 0; u < kBf16Parts; ++u) {
            dst[u * 2 * kRowTiles + r + kRowTiles * j] = parts[u];
          }
        }
      }
    }
  }
  __syncthreads();

  // Oᵀ: o[rt][j] = (dim g·D/8 + j: rows 8rt + 2t, 2t+1; dim g·D/8 + D/16 + j: the same rows).
  float o[kRowTiles][kMTiles][4];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) o[rt][j][0] = o[rt][j][1] = o[rt][j][2] = o[rt][j][3] = 0.f;
  }
  // Running max and denominator of rows 8r + 2t + i (l: this lane's keys' share).
  float m[kRowTiles][2], l[kRowTiles][2];
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) m[r][0] = m[r][1] = -INFINITY, l[r][0] = l[r][1] = 0.f;
  if (kPrefetch && s0 < s_end) cur.Unpack(next, g, t);
  for (; s0 < s_end; s0 += kTileKeys * kDecodeWarps) {
    if constexpr (kPrefetch) {
      const int s_next = s0 + kTileKeys * kDecodeWarps;
      if (s_next < s_end) next.Load(src, kvh, s_next, s_begin, s_end, g, t);
    } else {
      next.Load(src, kvh, s0, s_begin, s_end, g, t);
      cur.Unpack(next, g, t);
    }

    // Sᵀ = K Qᵀ: the tile's 16 keys are M, the query rows N (n-tile r: rows 8r .. 8r + 7), so no
    // operand is padding. st[r] = (key g: rows 8r+2t, 8r+2t+1; key 8+g: the same rows).
    // The split formats sum each part's products apart: st[part] (their scales differ).
    float st[Src::kParts][kRowTiles][4] = {};
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      uint32_t kh[2][4], kl[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int p = 0; p < 4; ++p) src.Bf16Pair(cur.k[n][i], i, p, kh[n][p], kl[n][p]);
      }
      float (&acc)[kRowTiles][4] = st[Src::KeyChunkPart(i)];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t qw[kQWords];  // b0, b1 of each row tile, as hi, mid[, lo]
        const uint32_t* qp = q_s + ((2 * i + h) * kWarp + lane) * kQWords;
#pragma unroll
        for (int w = 0; w < kQWords; ++w) qw[w] = qp[w];
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
          for (int u = 0; u < kBf16Parts; ++u) {
            MmaBf16(acc[r], kh[0][2 * h], kh[1][2 * h], kh[0][2 * h + 1], kh[1][2 * h + 1],
                    qw[u * 2 * kRowTiles + r], qw[u * 2 * kRowTiles + r + kRowTiles]);
          }
          if constexpr (Src::kLowHalf) {
            MmaBf16(acc[r], kl[0][2 * h], kl[1][2 * h], kl[0][2 * h + 1], kl[1][2 * h + 1],
                    qw[r], qw[r + kRowTiles]);
          }
        }
      }
    }

    // Online softmax; row R's 16 scores lie on the 8 lanes with t = (R % 8) / 2. Pᵀ operand of
    // row tile r (b0 = keys 2t, 2t+1 of row 8r + g; b1 = keys 8+2t, 9+2t) is the transpose of
    // the lane's (key, row pair) weights, each times its value's scale: movmatrix.
    uint32_t pp[Src::kParts][kRowTiles][2][kBf16Parts];  // [part][row tile][b0, b1][hi, mid, lo]
    float corr[kRowTiles][2];
    bool key_ok[2];
    // The key's position less the block's first token's (at most nt): the row of token tok sees
    // it when key_token <= tok and, with a window W, key_token > tok - W.
    int key_token[2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = s0 + 8 * n + g;
      key_ok[n] = key >= s_begin && key < s_end;
      key_token[n] = min(key - start, nt);
    }
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
      float pe[2][2];  // [key g, 8 + g][rows 8r + 2t, + 1]
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float x[2];
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const int tok = row_token[r][i];
          const bool seen = key_ok[n] && (nt == 1 || (key_token[n] <= tok &&
                            (a.sliding_window <= 0 || key_token[n] > tok - a.sliding_window)));
          if constexpr (Src::kParts == 1) {
            x[n] = seen ? st[0][r][2 * n + i] * a.scale * cur.k_scale[0][n] : -INFINITY;
          } else {
            x[n] = seen ? (st[0][r][2 * n + i] * cur.k_scale[0][n] +
                           st[1][r][2 * n + i] * cur.k_scale[1][n]) * a.scale
                        : -INFINITY;
          }
        }
        float mx = fmaxf(x[0], x[1]);
#pragma unroll
        for (int lane_bit = 4; lane_bit < kWarp; lane_bit <<= 1) {
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, lane_bit));
        }
        const float m_new = fmaxf(m[r][i], mx);
        corr[r][i] = m_new == -INFINITY ? 1.f : expf(m[r][i] - m_new);
        m[r][i] = m_new;
#pragma unroll
        for (int n = 0; n < 2; ++n) pe[n][i] = x[n] == -INFINITY ? 0.f : expf(x[n] - m_new);
        l[r][i] = l[r][i] * corr[r][i] + pe[0][i] + pe[1][i];
      }
#pragma unroll
      for (int part = 0; part < Src::kParts; ++part) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t parts[kBf16Parts];
          SplitBf16(pe[n][0] * cur.v_scale[part][n], pe[n][1] * cur.v_scale[part][n], parts);
#pragma unroll
          for (int u = 0; u < kBf16Parts; ++u) pp[part][r][n][u] = TransposeBf16x8x8(parts[u]);
        }
      }
    }
    // Oᵀ's columns are rows 8r + 2t, 8r + 2t + 1: the lane's own rows.
#pragma unroll
    for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
      for (int j = 0; j < kMTiles; ++j) {
        o[r][j][0] *= corr[r][0], o[r][j][1] *= corr[r][1];
        o[r][j][2] *= corr[r][0], o[r][j][3] *= corr[r][1];
      }
    }

    // Oᵀ += Vᵀ Pᵀ. Vᵀ of m-tile j: a0 (dim j of the lane's; keys 2t, 2t+1), a1 (dim D/16 + j),
    // a2 and a3 the same for keys 8+2t, 9+2t; made two m-tiles at a time, as the products need
    // them (registers).
#pragma unroll
    for (int w = 0; w < D / 32; ++w) {
      uint32_t a_h[2][4], a_l[2][4];
      src.template ValueOperands<D>(cur.v, w, a_h, a_l);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * w + jj;
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) {
          const auto& pr = pp[Src::ValuePart(w)][r];
#pragma unroll
          for (int u = 0; u < kBf16Parts; ++u) {
            MmaBf16(o[r][j], a_h[jj][0], a_h[jj][1], a_h[jj][2], a_h[jj][3], pr[0][u], pr[1][u]);
          }
          if constexpr (Src::kLowHalf) {
            MmaBf16(o[r][j], a_l[jj][0], a_l[jj][1], a_l[jj][2], a_l[jj][3], pr[0][0], pr[1][0]);
          }
        }
      }
    }
    if constexpr (kPrefetch) cur.Unpack(next, g, t);
  }

  // Merge the block's warps into rows_s, rotate it back (TurboQuant: linear, so a split's
  // unnormalised partial may be rotated before the combine), write it.
#pragma unroll
  for (int r = 0; r < kRowTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int lane_bit = 4; lane_bit < kWarp; lane_bit <<= 1) {
        l[r][i] += __shfl_xor_sync(0xffffffffu, l[r][i], lane_bit);
      }
      if (g == 0) m_s[warp * kRows + 8 * r + 2 * t + i] = m[r][i];
      if (g == 0) l_s[warp * kRows + 8 * r + 2 * t + i] = l[r][i];
    }
    // Offsets from the lane's first dim: compile-time for the one-part layout (vector stores).
    const int first = Src::template ValueDim<D>(g, 0, 0);
    float* row0 = o_s + (warp * kRows + 8 * r + 2 * t) * (D + 1) + first;
    float* row1 = row0 + (D + 1);
#pragma unroll
    for (int j = 0; j < kMTiles; ++j) {
      const int d0 = Src::template ValueDim<D>(g, j, 0) - first;
      const int d1 = Src::template ValueDim<D>(g, j, 1) - first;
      row0[d0] = o[r][j][0], row1[d0] = o[r][j][1];
      row0[d1] = o[r][j][2], row1[d1] = o[r][j][3];
    }
  }
  __syncthreads();
  // Each row's max M, its warps' weights e^(m_w - M) (in place of m_w) and denominator, once a
  // row (once an element, the 16 warps' exponentials were the epilogue's largest cost).
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    float M = -INFINITY, den = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, m_s[w * kRows + r]);
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float mw = m_s[w * kRows + r];
      const float e = mw == -INFINITY ? 0.f : expf(mw - M);
      m_s[w * kRows + r] = e;
      den = fmaf(e, l_s[w * kRows + r], den);
    }
    row_den_s[r] = den;
    if (p.partials) {
      const int64_t prow = split * p.total_tokens * a.num_heads +
                           (sq.token_offset + r / G) * a.num_heads + kvh * G + r % G;
      p.part_ml[prow * 2] = M, p.part_ml[prow * 2 + 1] = den;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    float num = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      num = fmaf(m_s[w * kRows + r], o_s[(w * kRows + r) * (D + 1) + d], num);
    }
    // den > 0 with one split: the row's own position is in it.
    rows_s[idx] = p.partials ? num : num / row_den_s[r];
  }
  __syncthreads();
  src.template RotateOutput<D>(rows_s, rows, kvh);
  __syncthreads();
  float* dst = p.partials ? p.part_o + split * p.total_tokens * a.num_heads * D : a.out;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D;
    dst[((sq.token_offset + r / G) * a.num_heads + kvh * G + r % G) * D + idx % D] = rows_s[idx];
  }
}

// Blocks of DecodeAttentionKernel<D, kRows, Src> that fit on one SM (registers, shared memory);
// the first call also lets the kernel have more than 48 KiB of shared memory where it needs it.
template <int D, int kRows, typename Src>
int DecodeBlocksPerSm() {
  constexpr int kWarps = DecodeWarps<D, kRows, Src>();
  constexpr size_t kSmem = DecodeSmemBytes<D, kRows, Src>();
  static const int blocks = [] {
    if (kSmem > 48 * 1024) {
      MOE_CUDA_CHECK(cudaFuncSetAttribute(DecodeAttentionKernel<D, kRows, Src>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kSmem)));
    }
    int n = 0;
    MOE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &n, DecodeAttentionKernel<D, kRows, Src>, kWarps * kWarp, kSmem));
    return n > 0 ? n : 1;
  }();
  return blocks;
}

template <int D, int kRows, typename Src>
void LaunchDecodeAttention(const AttnParams& p, const Src& src, dim3 grid, cudaStream_t stream) {
  constexpr int kWarps = DecodeWarps<D, kRows, Src>();
  DecodeBlocksPerSm<D, kRows, Src>();  // the shared-memory attribute, once
  Launch(DecodeAttentionKernel<D, kRows, Src>, grid, kWarps * kWarp,
         DecodeSmemBytes<D, kRows, Src>(), stream, p, src);
}

// The decode kernel's shapes: head_dim 64, 128 or 256 (dims in chunks of 8 per lane), at most
// 16 query heads per kv head (8 with head_dim 256: the merge's shared memory), chunk loads aligned.
template <typename Src>
bool DecodeShapeFits(const AttentionArgs& a, const Src& src) {
  const int G = a.num_heads / a.num_kv_heads, D = a.head_dim;
  return (D == 64 || D == 128 || (D == 256 && G <= 8)) && G <= 16 && src.DecodeAligned();
}

// RunAttention on the decode kernel; false (nothing launched) when the shape does not fit it.
// A sequence of n tokens (a prefill chunk) becomes blocks of kRows / G consecutive tokens (16
// rows: two tokens of 8 heads share each K/V tile), each row masked to its own causal end: a
// 2048-token prefill's attention takes 1.06 ms a layer of the Qwen3-30B-A3B shape (1.24 with one
// token a block; 2.83 on the SIMT kernel; H200, tests/bench/NOTES.md).
template <typename Src, typename Reserve, typename Stage>
bool RunDecodeAttention(const AttentionArgs& a, const std::vector<SeqDesc>& multi,
                        const Src& src, int num_sms, Reserve reserve, Stage stage,
                        cudaStream_t stream) {
  if (!DecodeShapeFits(a, src)) return false;
  AttnParams p;
  p.a = a;
  p.group = a.num_heads / a.num_kv_heads;
  const int D = a.head_dim;
  const bool prefill = std::any_of(multi.begin(), multi.end(),
                                   [](const SeqDesc& sq) { return sq.num_tokens > 1; });
  // 16 rows a block for more than 8 heads a group, and for prefill (several tokens a block).
  const bool wide = p.group > 8 || (prefill && D != 256);
  const int64_t per_block = std::max(1, (wide ? 16 : 8) / p.group);  // tokens a block
  int64_t keys = 0;
  std::vector<SeqDesc> seqs;
  for (const SeqDesc& sq : multi) {
    for (int64_t j = 0; j < sq.num_tokens; j += per_block) {
      SeqDesc chunk = sq;
      chunk.start_pos += j;
      chunk.num_tokens = std::min(per_block, sq.num_tokens - j);
      chunk.token_offset += j;
      seqs.push_back(chunk);
    }
    p.total_tokens += sq.num_tokens;
    keys = std::max(keys, sq.start_pos + sq.num_tokens);
  }
  if (p.total_tokens == 0) return true;
  // f(head_dim, rows) with both as std::integral_constant: the kernel instance for this call.
  auto with_shape = [D, wide](auto&& f) {
    using std::integral_constant;
    if constexpr (Src::kParts == 2) {  // the split formats: head_dim 128 only (ChoosePath)
      return wide ? f(integral_constant<int, 128>{}, integral_constant<int, 16>{})
                  : f(integral_constant<int, 128>{}, integral_constant<int, 8>{});
    } else {
      if (D == 64) {
        return wide ? f(integral_constant<int, 64>{}, integral_constant<int, 16>{})
                    : f(integral_constant<int, 64>{}, integral_constant<int, 8>{});
      }
      if (D == 128) {
        return wide ? f(integral_constant<int, 128>{}, integral_constant<int, 16>{})
                    : f(integral_constant<int, 128>{}, integral_constant<int, 8>{});
      }
      return f(integral_constant<int, 256>{}, integral_constant<int, 8>{});
    }
  };
  int per_sm = 0, warps = 0;  // blocks per SM, warps per block
  with_shape([&](auto d, auto rows) {
    per_sm = DecodeBlocksPerSm<decltype(d)::value, decltype(rows)::value, Src>();
    warps = DecodeWarps<decltype(d)::value, decltype(rows)::value, Src>();
  });
  // Split the keys so that one wave fills the GPU, each warp at least one tile of its own.
  const int64_t blocks = static_cast<int64_t>(seqs.size()) * a.num_kv_heads;
  const int64_t tiles = CeilDiv(keys, kTileKeys);
  const int64_t want = std::max<int64_t>(
      1, std::min({CeilDiv(int64_t{per_sm} * num_sms, blocks), CeilDiv(tiles, warps),
                   kMaxSplits}));
  p.keys_per_split = CeilDiv(tiles, want) * kTileKeys;
  p.num_splits = static_cast<int>(CeilDiv(keys, p.keys_per_split));
  p.partials = p.num_splits > 1 || Src::kCombineRotates;
  MOE_CHECK(seqs.size() <= 0x7fffffff && p.num_splits <= 65535 &&
            keys + p.keys_per_split <= 0x7fffffff)  // the kernel's positions are 32-bit
      << "DecodeAttention: grid " << seqs.size() << " x " << p.num_splits << ", " << keys
      << " positions";
  StageSeqsAndPartials(p, seqs, reserve, stage);
  const dim3 grid(static_cast<unsigned>(seqs.size()), static_cast<unsigned>(a.num_kv_heads),
                  static_cast<unsigned>(p.num_splits));
  with_shape([&](auto d, auto rows) {
    LaunchDecodeAttention<decltype(d)::value, decltype(rows)::value>(p, src, grid, stream);
  });
  if (p.partials) LaunchCombine(p, src, stream);
  return true;
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
  if (path == cuda::PagedPath::kHost) return Backend::PagedKvWrite(batch);  // prod formats
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
      StageHostArgs(kv_slots_, where.data(), where.size() * sizeof(int2)));
  unsigned long long* kv_verdict = StepVerdicts();
  kv_verdict_pending_ = true;
  kv_verdict_format_ = kv.codecs[0]->format();
  const dim3 grid(static_cast<unsigned>(where.size()), static_cast<unsigned>(kv.num_kv_heads), 2);
  const int threads = kv.head_dim <= 64 ? 64 : kv.head_dim <= 128 ? 128 : 256;
  const float* k = batch[0].k;
  const float* v = batch[0].v;
  if (path == cuda::PagedPath::kFp8) {
    cuda::Launch(cuda::PagedKvWriteKernel<true>, grid, threads, 0, stream_,
                 g, k, v, dev_where, kv_verdict);
  } else if (path == cuda::PagedPath::kBf16) {
    cuda::Launch(cuda::PagedKvWriteKernel<false>, grid, threads, 0, stream_,
                 g, k, v, dev_where, kv_verdict);
  } else if (path == cuda::PagedPath::kTqSplit) {
    const cuda::TqSplitTables tb = cuda::TqSplitDeviceTables(kv, TqTablesOnDevice(kv));
    auto launch = [&](auto kernel) {
      cuda::Launch(kernel, grid, cuda::kSplitD, cuda::kSplitMatrixBytes, stream_, g, tb, k, v,
                   dev_where, kv_verdict);
    };
    if (kv.codecs[0]->format() == KvFormat::kTq3p5) {
      launch(cuda::TqSplitWriteKernel<4, 3>);
    } else {
      launch(cuda::TqSplitWriteKernel<3, 2>);
    }
  } else {
    const cuda::TqTables tb = cuda::TqDeviceTables(kv, TqTablesOnDevice(kv));
    // TqWriteKernel<D, b> for this layer (ChoosePath: D a power of two 32 .. 256, b 1 .. 4).
    auto with_bits = [&](auto d) {
      constexpr int D = decltype(d)::value;
      auto launch = [&](auto kernel) {
        cuda::Launch(kernel, grid, cuda::kWarp, 0, stream_, g, tb, k, v, dev_where, kv_verdict);
      };
      switch (tb.bits) {
        case 1: launch(cuda::TqWriteKernel<D, 1>); break;
        case 2: launch(cuda::TqWriteKernel<D, 2>); break;
        case 3: launch(cuda::TqWriteKernel<D, 3>); break;
        case 4: launch(cuda::TqWriteKernel<D, 4>); break;
        default: MOE_CHECK(false) << "PagedKvWrite: TurboQuant with " << tb.bits << " bits";
      }
    };
    switch (kv.head_dim) {
      case 32: with_bits(std::integral_constant<int, 32>{}); break;
      case 64: with_bits(std::integral_constant<int, 64>{}); break;
      case 128: with_bits(std::integral_constant<int, 128>{}); break;
      case 256: with_bits(std::integral_constant<int, 256>{}); break;
      default: MOE_CHECK(false) << "PagedKvWrite: TurboQuant head_dim " << kv.head_dim;
    }
  }
  return absl::OkStatus();  // the verdict: TakeKvWriteError
}

const float* CudaBackend::TqTablesOnDevice(const PagedKvLayer& kv) {
  UploadedTables& t = tq_tables_[kv.codecs];
  const int n = 2 * kv.num_kv_heads;
  bool same = t.dev != nullptr && static_cast<int>(t.codec_ids.size()) == n;
  for (int i = 0; same && i < n; ++i) same = kv.codecs[i]->id() == t.codec_ids[i];
  if (same) return static_cast<const float*>(t.dev);
  const std::vector<float> host = cuda::IsSplit(kv.codecs[0]->format())
                                      ? cuda::TqSplitHostTables(kv)
                                      : cuda::TqHostTables(kv);
  const size_t bytes = host.size() * sizeof(float);
  if (t.bytes != bytes) {
    Synchronize();  // queued (or recorded) kernels may read the old copy
    MOE_CUDA_CHECK(cudaFree(t.dev));
    t.dev = nullptr;
    MOE_CUDA_CHECK(cudaMalloc(&t.dev, bytes));
    t.bytes = bytes;
  }
  graphs_->CopyFromHost(t.dev, host.data(), bytes, bytes);  // `host` may go on return
  t.codec_ids.resize(n);
  for (int i = 0; i < n; ++i) t.codec_ids[i] = kv.codecs[i]->id();
  return static_cast<const float*>(t.dev);
}

absl::Status CudaBackend::TakeKvWriteError() {
  if (!kv_verdict_pending_) return absl::OkStatus();
  kv_verdict_pending_ = false;
  // One copy a step: the routing verdict beside it comes along (TakeRoutingError reads it then).
  unsigned long long codes[2] = {~0ull, ~0ull};
  CopyToHost(codes, verdicts_, sizeof(codes));
  KeepRoutingVerdict(codes[1]);
  const unsigned long long code = codes[0];
  if (code == ~0ull) return absl::OkStatus();
  graphs_->Memset(verdicts_, 0xff, sizeof(unsigned long long));
  return absl::InvalidArgumentError(absl::StrCat(
      "KV write at position ", code >> 16, ", kv-head ", (code >> 1) & 0x7fff,
      code % 2 == 0 ? " key: " : " value: ", "KV ", KvFormatName(kv_verdict_format_),
      " quantization: the vector has a non-finite element or its scale exceeds the fp16 range "
      "(not written)"));
}

absl::Status CudaBackend::PagedAttention(absl::Span<const PagedAttentionArgs> batch) {
  if (batch.empty()) return absl::OkStatus();
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
  // The tensor-core kernel where the shape fits it (decode steps and prefill chunks), the SIMT
  // one otherwise.
  auto run = [&](const AttentionArgs& args, const auto& src) {
    if (!cuda::RunDecodeAttention(args, seqs, src, num_sms_, reserve, stage, stream_)) {
      cuda::RunAttention(args, seqs, src, num_sms_, reserve, stage, stream_);
    }
  };
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
  } else if (path == cuda::PagedPath::kFp8) {
    run(c, cuda::PagedKvSource<true>{{}, g});
  } else if (path == cuda::PagedPath::kBf16) {
    run(c, cuda::PagedKvSource<false>{{}, g});
  } else {
    // Rotated frame: q' = Π_K q, attention over s · C[idx], out = Πᵀ_V acc. The decode kernel
    // rotates in shared memory itself; otherwise two rotation kernels bracket the SIMT one.
    const cuda::TqTables tb = cuda::TqDeviceTables(kv, TqTablesOnDevice(kv));
    auto run_tq = [&](const auto& src) {
      if (cuda::RunDecodeAttention(c, seqs, src, num_sms_, reserve, stage, stream_)) return;
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
      cuda::RunAttention(rotated, seqs, src, num_sms_, reserve, stage, stream_);
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
  return absl::OkStatus();
}

}  // namespace moe::kernels
