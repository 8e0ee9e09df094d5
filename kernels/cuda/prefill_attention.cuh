// Prefill attention on the tensor cores, flash-attention style, over a bf16 or fp8 paged cache
// (PrefillAttentionKernel and its planning, RunPrefillAttention); included by paged_attention.cu.
//
// The decode kernel (decode_attention.cuh) takes a prefill chunk two tokens of 8 heads a block, so
// each block reads the keys of its two tokens again: a 2,048-token prompt of the Qwen3-30B-A3B
// shape spent 1 ms a layer there, 22% of its time to first token (H200, tests/bench/NOTES.md).
// Here a block takes 128 query rows (kPrefillWarps warps of 16 rows: row r of a sequence is token
// r / G, head kvh G + r % G), and the block's 8 warps share each tile of 64 keys and values,
// brought into shared memory by cp.async one tile ahead. Per warp and tile: S = Q Kᵀ (rows as M,
// keys as N), the online softmax on S's accumulator, O += P V with P taken straight from that
// accumulator as the A operand (the m16n8k16 C and A layouts agree), K through ldmatrix and V
// through ldmatrix.trans. Precision as the decode kernel's against bf16 elements: q and P enter as
// hi + mid + lo bf16 (fp32's 24 bits, SplitBf16), so the products are those of fp32 operands.
// An fp8 cache's codes are widened to bf16 (exact) in shared memory, each thread its own copies.
// Blocks run heaviest first (the last query tiles see the most keys).
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_attention.cuh"
#include "kernels/cuda/mma_smem.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace moe::kernels::cuda {
namespace {

constexpr int kPrefillWarps = 8;
constexpr int kPrefillRows = 16 * kPrefillWarps;  // query rows a block
constexpr int kPrefillKeys = 64;                  // keys a tile
constexpr int kPrefillParts = 3;                  // q and P as hi + mid + lo
// A sequence takes the prefill kernel from this many query rows (tokens times G), half a block,
// and this many tokens: a decode token keeps the decode kernel whatever G (its split of the keys).
constexpr int64_t kPrefillMinRows = kPrefillRows / 2, kPrefillMinTokens = 8;

// bf16 elements a shared-memory row holds: D and 8 of padding, so that the 8 rows an ldmatrix
// phase reads (stride D / 2 + 4 words) fall on distinct banks.
template <int D>
__host__ __device__ constexpr int PrefillRowElems() {
  return D + 8;
}

// bf16 tile stages: a bf16 cache's tiles are copied in as they are, two stages; an fp8 cache's
// codes are copied into raw stages (two: codes and scales) and made bf16 in one stage.
template <bool kFp8>
__host__ __device__ constexpr int PrefillBf16Stages() {
  return kFp8 ? 1 : 2;
}

// Q [part][row], the bf16 stages of [K, V][key] rows; fp8: then two raw stages of [K, V][key]
// codes and of [K, V][key] scales.
template <int D, bool kFp8>
constexpr size_t PrefillSmemBytes() {
  return sizeof(uint16_t) * PrefillRowElems<D>() *
             (kPrefillParts * kPrefillRows + PrefillBf16Stages<kFp8>() * 2 * kPrefillKeys) +
         (kFp8 ? 2 * 2 * kPrefillKeys * (D + sizeof(float)) : 0);
}

// An E4M3 pair (the low 16 bits of w) as a bf16 pair: exact (3 mantissa bits).
__device__ __forceinline__ uint32_t E4m3PairAsBf16(uint32_t w) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// Grid (query tiles of all sequences, NKV); p.seqs[i].tile_begin counts tiles of kPrefillRows.
// kFp8: the products take the codes; the key's scale multiplies its score and the value's its
// weight in P (after the softmax's sum), as the decode kernel does.
template <int D, bool kFp8>
__global__ __launch_bounds__(kPrefillWarps* kWarp,
                             1) void PrefillAttentionKernel(const AttnParams p,
                                                            const PagedGeom all_g) {
  constexpr int kRow = PrefillRowElems<D>();
  extern __shared__ __align__(16) uint16_t prefill_smem[];
  uint16_t* q_s = prefill_smem;                                // [part][row][kRow]
  uint16_t* kv_s = q_s + kPrefillParts * kPrefillRows * kRow;  // [stage][K, V][key][kRow]
  // fp8: [stage][K, V][key][D] codes, then [stage][K, V][key] scales.
  uint8_t* raw_s =
      reinterpret_cast<uint8_t*>(kv_s + PrefillBf16Stages<kFp8>() * 2 * kPrefillKeys * kRow);
  float* scale_s = reinterpret_cast<float*>(raw_s + 2 * 2 * kPrefillKeys * D);
  WaitForPriorKernel();
  const AttentionArgs& a = p.a;
  const int G = p.group, kvh = blockIdx.y;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int g = lane / 4, t = lane % 4;
  // The block's query tile, heaviest first, and its sequence: the last whose tiles begin at or
  // before it.
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  int first = 0, last = p.num_seqs - 1;
  while (first < last) {
    const int mid = (first + last + 1) / 2;
    if (p.seqs[mid].tile_begin <= tile) {
      first = mid;
    } else {
      last = mid - 1;
    }
  }
  const SeqDesc sq = p.seqs[first];
  const PagedGeom geo = all_g.ForTable(sq.table_offset);
  const int64_t rows = sq.num_tokens * G;
  const int64_t r0 = (tile - sq.tile_begin) * kPrefillRows;
  const int64_t row_stride = static_cast<int64_t>(a.num_heads) * D;  // floats a token of q, out
  const float* q = a.q + sq.token_offset * row_stride;
  float* out = a.out + sq.token_offset * row_stride;
  // Keys [0, key_end) for the block: up to its last row's token.
  const int64_t key_end = sq.start_pos + (Min64(r0 + kPrefillRows, rows) - 1) / G + 1;
  const int num_tiles = static_cast<int>(CeilDiv(key_end, kPrefillKeys));

  // Tile i's keys and values into stage `stage`; past key_end zeros (P is 0 there, and 0 times
  // garbage is not). Piece c of a thread is 16 bytes of one key, c < kPieces.
  constexpr int kPieceElems = kFp8 ? 16 : 8, kPieces = kPrefillKeys * D / kPieceElems;
  auto load_tile = [&](int i, int stage) {
    for (int c = threadIdx.x; c < kPieces; c += blockDim.x) {
      const int key = c / (D / kPieceElems), d = c % (D / kPieceElems) * kPieceElems;
      const int64_t s = static_cast<int64_t>(i) * kPrefillKeys + key;
      const bool ok = s < key_end;
      const int64_t at = ok ? s : 0;
      const int slot = static_cast<int>(at % geo.block_size);
      const uint8_t* k = geo.Tile(at, kvh, 0);
      if constexpr (kFp8) {
        uint8_t* dst = raw_s + (stage * 2 * kPrefillKeys + key) * D + d;
        CpAsync16(dst, k + slot * D + d, ok);
        CpAsync16(dst + kPrefillKeys * D, k + geo.tile_bytes + slot * D + d, ok);
        if (d == 0) {  // the key's scales
          float* sc = scale_s + stage * 2 * kPrefillKeys + key;
          const int64_t at_scale = static_cast<int64_t>(geo.block_size) * D + 4 * slot;
          CpAsyncSmall<4>(sc, k + at_scale, ok);
          CpAsyncSmall<4>(sc + kPrefillKeys, k + geo.tile_bytes + at_scale, ok);
        }
      } else {
        uint16_t* dst = kv_s + (stage * 2 * kPrefillKeys + key) * kRow + d;
        CpAsync16(dst, k + (slot * D + d) * 2, ok);
        CpAsync16(dst + kPrefillKeys * kRow, k + geo.tile_bytes + (slot * D + d) * 2, ok);
      }
    }
    CpAsyncCommit();
  };
  // fp8: this thread's pieces of stage `stage` (its own copies: no barrier before), made bf16.
  auto widen_tile = [&](int stage) {
    for (int c = threadIdx.x; c < kPieces; c += blockDim.x) {
      const int key = c / (D / kPieceElems), d = c % (D / kPieceElems) * kPieceElems;
#pragma unroll
      for (int role = 0; role < 2; ++role) {
        const uint4 w = *reinterpret_cast<const uint4*>(
            raw_s + ((stage * 2 + role) * kPrefillKeys + key) * D + d);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
        uint32_t b[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) b[j] = E4m3PairAsBf16(words[j / 2] >> (16 * (j % 2)));
        uint4* dst = reinterpret_cast<uint4*>(kv_s + (role * kPrefillKeys + key) * kRow + d);
        dst[0] = make_uint4(b[0], b[1], b[2], b[3]);
        dst[1] = make_uint4(b[4], b[5], b[6], b[7]);
      }
    }
  };
  load_tile(0, 0);

  // The block's queries as three bf16 parts (rows past the sequence: zeros).
  for (int u = threadIdx.x; u < kPrefillRows * D / 4; u += blockDim.x) {
    const int row = u / (D / 4), d = u % (D / 4) * 4;
    const int64_t r = r0 + row;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < rows) {
      x = *reinterpret_cast<const float4*>(q + r / G * row_stride + (kvh * G + r % G) * D + d);
    }
    uint32_t lo[kPrefillParts], hi[kPrefillParts];
    SplitBf16<kPrefillParts>(x.x, x.y, lo);
    SplitBf16<kPrefillParts>(x.z, x.w, hi);
#pragma unroll
    for (int part = 0; part < kPrefillParts; ++part) {
      *reinterpret_cast<uint2*>(q_s + (part * kPrefillRows + row) * kRow + d) =
          make_uint2(lo[part], hi[part]);
    }
  }

  // This warp's rows r0 + 16 warp + g (h = 0) and + 8 (h = 1): their positions, -1 past the
  // sequence (every key masked, nothing stored).
  const int64_t wr = r0 + 16 * warp;
  int64_t pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t r = wr + g + 8 * h;
    pos[h] = r < rows ? sq.start_pos + r / G : -1;
  }
  const int64_t warp_last = wr < rows ? sq.start_pos + (Min64(wr + 16, rows) - 1) / G : -1;

  float o[D / 8][4] = {};  // rows g, g + 8 by dims 8j + 2t, + 1
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  for (int i = 0; i < num_tiles; ++i) {
    if (i + 1 < num_tiles) {
      load_tile(i + 1, (i + 1) % 2);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    if constexpr (kFp8) widen_tile(i % 2);
    __syncthreads();
    const int64_t key0 = static_cast<int64_t>(i) * kPrefillKeys;
    if (key0 <= warp_last) {  // warp-uniform
      const uint16_t* ks = kv_s + (kFp8 ? 0 : i % 2) * 2 * kPrefillKeys * kRow;
      const uint16_t* vs = ks + kPrefillKeys * kRow;
      const float* k_scale = scale_s + (i % 2) * 2 * kPrefillKeys;  // fp8
      const float* v_scale = k_scale + kPrefillKeys;
      // S = Q Kᵀ: n-tile n holds keys 8n + 2t, + 1.
      float s[kPrefillKeys / 8][4] = {};
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kb[kPrefillKeys / 8][2];
#pragma unroll
        for (int np = 0; np < kPrefillKeys / 16; ++np) {
          uint32_t r[4];
          const int key = 16 * np + lane % 8 + lane / 16 * 8, d = 16 * kk + lane / 8 % 2 * 8;
          LdMatrixX4(SharedAddress(ks + key * kRow + d), r);
          kb[2 * np][0] = r[0], kb[2 * np][1] = r[1];
          kb[2 * np + 1][0] = r[2], kb[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int part = 0; part < kPrefillParts; ++part) {
          uint32_t qa[4];
          const int row = 16 * warp + lane % 16, d = 16 * kk + lane / 16 * 8;
          LdMatrixX4(SharedAddress(q_s + (part * kPrefillRows + row) * kRow + d), qa);
#pragma unroll
          for (int n = 0; n < kPrefillKeys / 8; ++n) {
            MmaBf16(s[n], qa[0], qa[1], qa[2], qa[3], kb[n][0], kb[n][1]);
          }
        }
      }
      // Online softmax (the decode kernel's: scale after the dot product, expf).
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int n = 0; n < kPrefillKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 8 * n + 2 * t + e % 2;
          const float st = kFp8 ? s[n][e] * k_scale[j] : s[n][e];
          const float x = key0 + j <= pos[e / 2] ? st * a.scale : -INFINITY;
          s[n][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
      }
      float corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        corr[h] = mx[h] == -INFINITY ? 1.f : expf(m[h] - mx[h]);
        m[h] = mx[h];
      }
#pragma unroll
      for (int n = 0; n < kPrefillKeys / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = s[n][e];
          s[n][e] = x == -INFINITY ? 0.f : expf(x - m[e / 2]);
          sum[e / 2] += s[n][e];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * corr[h] + sum[h];
      if constexpr (kFp8) {  // each weight times its value's scale
#pragma unroll
        for (int n = 0; n < kPrefillKeys / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] *= v_scale[8 * n + 2 * t + e % 2];
        }
      }
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= corr[0], o[j][1] *= corr[0], o[j][2] *= corr[1], o[j][3] *= corr[1];
      }
      // O += P V, 16 keys a k-step: P's fragment from n-tiles 2kk and 2kk + 1 of s.
#pragma unroll
      for (int kk = 0; kk < kPrefillKeys / 16; ++kk) {
        uint32_t pa[4][kPrefillParts];
        SplitBf16<kPrefillParts>(s[2 * kk][0], s[2 * kk][1], pa[0]);
        SplitBf16<kPrefillParts>(s[2 * kk][2], s[2 * kk][3], pa[1]);
        SplitBf16<kPrefillParts>(s[2 * kk + 1][0], s[2 * kk + 1][1], pa[2]);
        SplitBf16<kPrefillParts>(s[2 * kk + 1][2], s[2 * kk + 1][3], pa[3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t r[4];
          const int key = 16 * kk + lane % 8 + lane / 8 % 2 * 8, d = 16 * dp + lane / 16 * 8;
          LdMatrixX4Trans(SharedAddress(vs + key * kRow + d), r);
#pragma unroll
          for (int part = 0; part < kPrefillParts; ++part) {
            MmaBf16(o[2 * dp], pa[0][part], pa[1][part], pa[2][part], pa[3][part], r[0], r[1]);
            MmaBf16(o[2 * dp + 1], pa[0][part], pa[1][part], pa[2][part], pa[3][part], r[2], r[3]);
          }
        }
      }
    }
    __syncthreads();  // the stage is overwritten by the next iteration's loads
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    if (pos[h] < 0) continue;
    const int64_t r = wr + g + 8 * h;
    float* dst = out + r / G * row_stride + (kvh * G + r % G) * D + 2 * t;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<float2*>(dst + 8 * j) =
          make_float2(o[j][2 * h] / l[h], o[j][2 * h + 1] / l[h]);
    }
  }
}

template <int D, bool kFp8>
void LaunchPrefillAttention(const AttnParams& p, const PagedGeom& g, int64_t tiles,
                            cudaStream_t stream) {
  constexpr size_t kSmem = PrefillSmemBytes<D, kFp8>();
  static const bool attr = [] {  // once per instance: more than 48 KiB of shared memory
    MOE_CUDA_CHECK(cudaFuncSetAttribute(PrefillAttentionKernel<D, kFp8>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmem)));
    return true;
  }();
  (void)attr;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.a.num_kv_heads));
  Launch(PrefillAttentionKernel<D, kFp8>, grid, kPrefillWarps * kWarp, kSmem, stream, p, g);
}

// RunAttention with the prefill kernel for the sequences of `seqs` that have at least
// kPrefillMinTokens tokens and kPrefillMinRows query rows (prefill chunks), when the call fits
// it: a bf16 or fp8 (kFp8) cache, plain causal attention (no key lag, no sliding window),
// head_dim 64 or 128, q and out 16-byte aligned. The others (decode tokens, short chunks) keep
// the decode kernel, whose split of the keys the prefill kernel lacks: run_rest(args, rest) gets
// each run of them whose rows follow one another, as a call of its own (q and out at the run's
// first row). False, with nothing launched, when the prefill kernel takes no sequence.
template <bool kFp8, typename Stage, typename RunRest>
bool RunPrefillAttention(const AttentionArgs& a, const std::vector<SeqDesc>& seqs,
                         const PagedGeom& g, int64_t key_lag, Stage stage, cudaStream_t stream,
                         RunRest run_rest) {
  const int D = a.head_dim, G = a.num_heads / a.num_kv_heads;
  const bool fits =
      (D == 64 || D == 128) && key_lag == 0 && a.sliding_window == 0 && g.AlignedTo(16) &&
      ((reinterpret_cast<uintptr_t>(a.q) | reinterpret_cast<uintptr_t>(a.out)) & 15) == 0;
  if (!fits) return false;
  std::vector<SeqDesc> mine;
  std::vector<std::vector<SeqDesc>> runs;  // the others, in runs of consecutive rows
  int64_t tiles = 0, run_end = -1;
  for (const SeqDesc& sq : seqs) {
    if (sq.num_tokens == 0) continue;
    if (sq.num_tokens >= kPrefillMinTokens && sq.num_tokens * G >= kPrefillMinRows) {
      SeqDesc s = sq;
      s.tile_begin = tiles;
      tiles += CeilDiv(sq.num_tokens * G, kPrefillRows);
      mine.push_back(s);
      continue;
    }
    if (sq.token_offset != run_end) runs.emplace_back();
    runs.back().push_back(sq);
    run_end = sq.token_offset + sq.num_tokens;
  }
  if (mine.empty()) return false;
  MOE_CHECK(tiles <= 0x7fffffff) << "PrefillAttention: " << tiles << " query tiles";
  AttnParams p;
  p.a = a;
  p.group = G;
  p.num_seqs = static_cast<int>(mine.size());
  p.seqs = static_cast<const SeqDesc*>(stage(mine.data(), mine.size() * sizeof(SeqDesc)));
  if (D == 64) {
    LaunchPrefillAttention<64, kFp8>(p, g, tiles, stream);
  } else {
    LaunchPrefillAttention<128, kFp8>(p, g, tiles, stream);
  }
  const int64_t row = static_cast<int64_t>(a.num_heads) * D;
  for (std::vector<SeqDesc>& run : runs) {
    const int64_t first = run.front().token_offset;
    for (SeqDesc& sq : run) sq.token_offset -= first;
    AttentionArgs args = a;
    args.q = a.q + first * row;
    args.out = a.out + first * row;
    run_rest(args, run);
  }
  return true;
}

}  // namespace
}  // namespace moe::kernels::cuda
