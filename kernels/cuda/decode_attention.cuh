// The tensor-core decode attention (DecodeAttentionKernel) and its planning (RunDecodeAttention),
// generic over the paged K/V sources; included by paged_attention.cu, which instances it.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/base/status.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace moe::kernels::cuda {
namespace {

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
  const int lag = static_cast<int>(p.key_lag);
  const int s_end = min(pos + 1 - lag, (split + 1) * static_cast<int>(p.keys_per_split));
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
          const bool seen =
              key_ok[n] &&
              (nt == 1 || (key_token[n] <= tok - lag &&
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
bool RunDecodeAttention(const AttentionArgs& a, const std::vector<SeqDesc>& multi, const Src& src,
                        int num_sms, Reserve reserve, Stage stage, cudaStream_t stream,
                        KeyLag lag = {}) {
  if (!DecodeShapeFits(a, src)) return false;
  AttnParams p;
  p.a = a;
  p.key_lag = lag.lag;
  p.row_ml = lag.row_ml;
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
  // Split the keys so that the blocks fill one wave, each warp at least one tile of its own. The
  // count is rounded down: rounded up, 256 blocks (64 sequences of 4 kv heads) on 264 slots were
  // 2 splits, a second wave and the combine's launch (H200, tests/bench/NOTES.md, stop 47).
  const int64_t blocks = static_cast<int64_t>(seqs.size()) * a.num_kv_heads;
  const int64_t tiles = CeilDiv(keys, kTileKeys);
  const int64_t want = std::max<int64_t>(
      1, std::min({int64_t{per_sm} * num_sms / blocks, CeilDiv(tiles, warps), kMaxSplits}));
  p.keys_per_split = CeilDiv(tiles, want) * kTileKeys;
  p.num_splits = static_cast<int>(CeilDiv(keys, p.keys_per_split));
  p.partials = p.num_splits > 1 || Src::kCombineRotates || p.row_ml != nullptr;
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
