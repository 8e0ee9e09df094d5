// The SIMT flash-attention kernel, its split combine and their planning (RunAttention), shared
// by attention.cu (the contiguous cache) and paged_attention.cu (the paged cache, where the
// tensor-core decode kernel does not take the shape).
//
// Causal GQA attention on the GPU, flash-attention style (online softmax over key tiles in shared
// memory), split over keys for decode (flash-decoding).
//
// Legend: T tokens, NH query heads, NKV kv heads, G = NH / NKV, D head dim, S cached positions.
// A block takes 16 query rows of one kv head: row qi of [T * G] is token qi / G, head
// kvh * G + qi % G, so the G query heads sharing a kv head share every K/V tile it loads (decode:
// one block holds all G heads of the token). Grid (ceil(T*G / 16), NKV, splits); 4 warps, each
// owning 4 query rows; within a tile lane j scores key j, and each lane owns D/32 output columns.
// With splits > 1 every block writes an unnormalised partial (o, m, l), merged by a second kernel.
// One launch serves a batch of sequences (PagedAttention: a step's items): grid.x runs over the
// query tiles of all of them, and each block finds its sequence in a small device table.
#pragma once

#include <algorithm>
#include <vector>

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
  // The kernel writes partials (part_o, part_ml) and a combine kernel the output: when split, and
  // always for a source whose combine also rotates the output back (kCombineRotates).
  bool partials = false;
  float* part_o = nullptr;   // [splits, T * NH, D]
  float* part_ml = nullptr;  // [splits, T * NH, 2]: running max m, denominator l
  // The compressed part of an attention with a 16-bit tail (paged_attention.cu): the row at
  // position p sees keys s <= p - key_lag only (0: plain causal), always through partials, and
  // the combine also writes each row's max and denominator to row_ml [T * NH, 2] (a row that
  // saw no key: -inf and 0, its output undefined), which the tail's kernel merges with.
  int64_t key_lag = 0;
  float* row_ml = nullptr;
};

// What a caller of RunAttention and RunDecodeAttention asks beyond plain causal attention
// (AttnParams::key_lag, row_ml).
struct KeyLag {
  int64_t lag = 0;
  float* row_ml = nullptr;
};

template <int DMAX>
size_t AttentionSmemBytes() {
  return sizeof(float) * (kQRows * DMAX + kKeys * (DMAX + 1) + kKeys * DMAX);
}

// Where K/V elements come from: the contiguous fp32 cache of AttentionArgs, or the paged,
// possibly compressed blocks (paged_attention.cu). Load(s, kvh, d) returns K and V of
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
  const int64_t s_end = Min64(sq.start_pos + t_hi + 1 - p.key_lag, (split + 1) * p.keys_per_split);

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
      const bool ok = valid[r] && s < s_end && s <= pos[r] - p.key_lag && s >= lo[r];
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
  if (p.row_ml != nullptr && threadIdx.x == 0) {
    p.row_ml[2 * row] = M;
    p.row_ml[2 * row + 1] = den;
  }
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
                  Reserve reserve, Stage stage, cudaStream_t stream, KeyLag lag = {}) {
  AttnParams p;
  p.a = a;
  p.key_lag = lag.lag;
  p.row_ml = lag.row_ml;
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
  p.partials = p.num_splits > 1 || Src::kCombineRotates || p.row_ml != nullptr;
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
