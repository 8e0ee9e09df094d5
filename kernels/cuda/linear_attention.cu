// GatedDeltaNet on the GPU (backend.h: MulSigmoid, GatedRmsNorm, CausalConv, GatedDeltaRule; Mul
// and CausalConv without SiLU also serve LFM2's short conv); the CPU reference is
// cpu/linear_attention.cc.
//
// The per-sequence spans (host memory) are staged once per call as a small device table
// (StageHostArgs, so a recorded step copies it from the step graph's arena and stays
// replayable). Every kernel reads the sequences from that table: nothing here synchronises.
//
// GatedDeltaRule takes the CPU's two forms: the recurrent step for one-token sequences
// (decode: DeltaRuleWarpKernel, S columns in registers, a warp per 8 columns) and the chunked
// form for longer ones (prefill: DeltaRuleChunkedKernel, a block per (sequence, value head, 32
// columns of S), 64-token chunks in shared memory, fp32 on the CUDA cores). A call with both
// launches both; each returns at once for the other's sequences. CausalConv is time-parallel:
// a thread per (channel, run of 16 tokens); sequences longer than one run get their new state
// from a second launch, after every run has read the old one.
// H200, NK 16, DK = DV = 128, one prompt, before (recurrent for every token) -> after
// (tests/gpu_results/gdn_chunked_stop39.txt): GatedDeltaRule at NV 32 512 / 2048 / 4096 tokens
// 0.77 / 4.08 / 8.39 -> 0.40 / 1.62 / 3.22 ms, at NV 64 (the 397B) 1.06 / 4.35 / 8.62 ->
// 0.53 / 2.10 / 4.18 ms; CausalConv (8192 channels) 0.13 / 0.92 / 1.84 -> 0.018 / 0.070 / 0.126
// ms. Decode is unchanged (7.3 us one sequence, 144 us 64). The chunked kernel is ~50 us a
// chunk, latency-bound (barriered phases, 8 warps; the fp32 floor of the whole 4096-token call
// is ~0.4 ms): next are the tensor cores (3xTF32) and taking P, A and (I + A)^-1 out of the
// sequential loop (they do not depend on S: a first kernel can form them for every chunk).
#include <algorithm>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"

namespace moe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One sequence of the call as the kernels read it (device memory).
struct SeqDev {
  int64_t row = 0;  // first token row
  int64_t num_tokens = 0;
  float* state = nullptr;  // conv_state (CausalConv) or state (GatedDeltaRule)
};

// A weight element of a dense dtype (the dtype is uniform across the grid: no divergence).
__device__ __forceinline__ float LoadW(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ float SigmoidOf(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float Silu(float x) { return x / (1.f + expf(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20), as the CPU reference
__device__ __forceinline__ float Softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

void CheckDense(const TensorView& w, const char* op) {
  MOE_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.dtype == DType::kF16)
      << op << ": unsupported weight dtype " << DTypeName(w.dtype);
}

__global__ void MulSigmoidKernel(float* x, const float* gate, int64_t n) {
  WaitForPriorKernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= SigmoidOf(gate[i]);
  }
}

__global__ void MulKernel(float* out, const float* a, const float* b, int64_t n) {
  WaitForPriorKernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] * b[i];
  }
}

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight * silu(z[r]), one block per row. Each thread
// reads and writes the same elements, so out may alias x.
__global__ void GatedRmsNormKernel(float* out, const float* x, const float* z, int64_t n,
                                   const void* weight, DType wt, float eps) {
  WaitForPriorKernel();
  const float* xr = x + blockIdx.x * n;
  const float* zr = z + blockIdx.x * n;
  float* outr = out + blockIdx.x * n;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(xr[i], xr[i], sum);
  sum = BlockSum(sum);
  const float inv = 1.f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    outr[i] = xr[i] * inv * LoadW(weight, wt, i) * Silu(zr[i]);
  }
}

constexpr int kMaxConvWidth = 8;

// Time-parallel: thread (channel c, tokens [t0, t0 + kConvRun) of sequence blockIdx.z), grid
// (channel blocks, runs, sequences). The window is win[kMaxConvWidth - KW ..): the KW - 1
// inputs before the current one, oldest first, then the current one (those before the
// sequence from the old conv state); constant indices keep it in registers for any
// KW <= kMaxConvWidth. The thread whose run is the whole sequence (decode) also writes the new
// state: nobody else reads it. Longer sequences' states are written by CausalConvStateKernel,
// launched after this one, so no run reads a state already replaced. bias (dtype bt) is null
// without one; silu: the activation after the sum (GatedDeltaNet) or none (LFM2's short conv).
constexpr int kConvRun = 16;
static_assert(kConvRun >= kMaxConvWidth - 1, "a longer sequence's state is all its own inputs");

__global__ void CausalConvKernel(float* out, const float* x, const void* weight, DType wt,
                                 const void* bias, DType bt, bool silu, int64_t C, int KW,
                                 const SeqDev* seqs) {
  WaitForPriorKernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const SeqDev s = seqs[blockIdx.z];
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kConvRun;
  if (c >= C || t0 >= s.num_tokens) return;
  const int64_t t1 = Min64(t0 + kConvRun, s.num_tokens);
  float* state = s.state + c * (KW - 1);  // oldest first
  constexpr int kM = kMaxConvWidth;
  const int first = kM - KW;  // window slot of weight 0
  float w[kM], win[kM];
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    w[i] = i >= first ? LoadW(weight, wt, c * KW + (i - first)) : 0.f;
    const int64_t at = t0 - (kM - 1 - i);  // the slot's position in the sequence
    win[i] =
        i >= first && i < kM - 1 ? (at >= 0 ? x[(s.row + at) * C + c] : state[KW - 1 + at]) : 0.f;
  }
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t at = (s.row + t) * C + c;
    win[kM - 1] = x[at];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      if (i >= first) acc += w[i] * win[i];  // the CPU's order: weight 0 first
    }
    if (bias != nullptr) acc += LoadW(bias, bt, c);
    out[at] = silu ? Silu(acc) : acc;
#pragma unroll
    for (int i = 0; i < kM - 1; ++i) win[i] = win[i + 1];
  }
  if (t0 == 0 && t1 == s.num_tokens) {
#pragma unroll
    for (int i = 0; i < kM - 1; ++i) {
      if (i >= first) state[i - first] = win[i];
    }
  }
}

// The new conv state of sequences longer than one run: their last KW - 1 inputs. Grid
// (channel blocks, sequences).
__global__ void CausalConvStateKernel(const float* x, int64_t C, int KW, const SeqDev* seqs) {
  WaitForPriorKernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const SeqDev s = seqs[blockIdx.y];
  if (c >= C || s.num_tokens <= kConvRun) return;  // CausalConvKernel wrote it
  for (int i = 0; i < KW - 1; ++i) {
    s.state[c * (KW - 1) + i] = x[(s.row + s.num_tokens - (KW - 1) + i) * C + c];
  }
}

// The delta rule's shapes: head dims up to kMaxHeadDim.
constexpr int kMaxHeadDim = 256;

struct DeltaRuleParams {
  float* out;
  const float* qkv;
  const float* b;
  const float* a;
  const void* a_log;
  const void* dt_bias;
  int32_t a_log_type, dt_bias_type;  // DType (int32_t: no padding in the graph signature)
  int NK, NV, DK, DV;
  const SeqDev* seqs;
};

// The recurrent delta rule for one-token sequences (decode; DeltaRuleChunkedKernel takes the
// longer ones of the call), warp by warp: warp w of block (column tile, value head h, sequence)
// owns 8 columns of S [DK, DV]; lane l holds column 32 * blockIdx.x + 8 w + l % 8 at rows
// l / 8, l / 8 + 4, ... (registers). A warp's load of S is 4 rows x 32 bytes (full sectors);
// the sums over DK are 4 lanes' partials joined by shuffles, so the token loop has no block-wide
// barrier: each warp normalises q and k itself into its own shared slice.
constexpr int kWarpCols = 8;
constexpr int kRowGroups = kWarp / kWarpCols;  // 4
constexpr int kWarpsPerBlock = 4;
constexpr int kTileCols = kWarpCols * kWarpsPerBlock;  // 32 columns a block
constexpr int kWarpRows = kMaxHeadDim / kRowGroups;    // 64 rows a lane at most

__global__ __launch_bounds__(kWarp* kWarpsPerBlock) void DeltaRuleWarpKernel(DeltaRuleParams p) {
  WaitForPriorKernel();
  __shared__ float qk[kWarpsPerBlock][2][kMaxHeadDim];  // per warp: normalised q, then k
  const SeqDev s = p.seqs[blockIdx.z];
  if (s.num_tokens > 1) return;  // DeltaRuleChunkedKernel's
  const int h = blockIdx.y, kh = h / (p.NV / p.NK);
  const int DK = p.DK, DV = p.DV;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int rg = lane / kWarpCols;
  const int j = blockIdx.x * kTileCols + warp * kWarpCols + lane % kWarpCols;
  if (blockIdx.x * kTileCols + warp * kWarpCols >= DV) return;  // no barrier below: may leave
  const bool has_col = j < DV;
  const int64_t C = 2 * static_cast<int64_t>(p.NK) * DK + static_cast<int64_t>(p.NV) * DV;
  float* S = s.state + static_cast<int64_t>(h) * DK * DV;
  float* qs = qk[warp][0];
  float* ks = qk[warp][1];

  float sreg[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int i = rg + kRowGroups * r;
    sreg[r] = has_col && i < DK ? S[static_cast<int64_t>(i) * DV + j] : 0.f;
  }
  const float neg_a = -expf(LoadW(p.a_log, static_cast<DType>(p.a_log_type), h));
  const float dt = LoadW(p.dt_bias, static_cast<DType>(p.dt_bias_type), h);
  const float q_scale = 1.f / sqrtf(static_cast<float>(DK));

  for (int64_t t = 0; t < s.num_tokens; ++t) {
    const int64_t row = s.row + t;
    const float* x = p.qkv + row * C;
    const float* xq = x + kh * DK;
    const float* xk = x + static_cast<int64_t>(p.NK) * DK + kh * DK;
    float qsum = 0.f, ksum = 0.f;
    for (int d = lane; d < DK; d += kWarp) {
      const float qv = xq[d], kv = xk[d];
      qs[d] = qv;
      ks[d] = kv;
      qsum = fmaf(qv, qv, qsum);
      ksum = fmaf(kv, kv, ksum);
    }
    qsum = WarpSum(qsum);
    ksum = WarpSum(ksum);
    const float qn = 1.f / sqrtf(qsum + 1e-6f) * q_scale, kn = 1.f / sqrtf(ksum + 1e-6f);
    const float v = has_col ? x[2 * static_cast<int64_t>(p.NK) * DK + h * DV + j] : 0.f;
    const float beta = SigmoidOf(p.b[row * p.NV + h]);
    const float decay = expf(neg_a * Softplus(p.a[row * p.NV + h] + dt));
    __syncwarp();
    // S <- decay S;  e = beta (v - S^T k)   (k normalised: kn applied to the sum)
    float part = 0.f;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int i = rg + kRowGroups * r;
      if (i < DK) {
        sreg[r] *= decay;
        part = fmaf(sreg[r], ks[i], part);
      }
    }
    part += __shfl_xor_sync(0xffffffffu, part, 8);
    part += __shfl_xor_sync(0xffffffffu, part, 16);
    const float e = beta * (v - part * kn);
    // S <- S + k e^T;  out = S^T q
    const float ek = e * kn;
    part = 0.f;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int i = rg + kRowGroups * r;
      if (i < DK) {
        sreg[r] = fmaf(ks[i], ek, sreg[r]);
        part = fmaf(sreg[r], qs[i], part);
      }
    }
    part += __shfl_xor_sync(0xffffffffu, part, 8);
    part += __shfl_xor_sync(0xffffffffu, part, 16);
    if (rg == 0 && has_col) p.out[row * p.NV * DV + h * DV + j] = part * qn;
    __syncwarp();  // qs and ks are rewritten by the next token
  }
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int i = rg + kRowGroups * r;
    if (has_col && i < DK) S[static_cast<int64_t>(i) * DV + j] = sreg[r];
  }
}

// The chunked delta rule for sequences of more than one token (cpu/linear_attention.cc
// ChunkedHead, architectures.md §1.6). Block (32 columns of S, value head h, sequence), 256
// threads; the sequence's chunks of kChunk positions in order. Per chunk:
//   gamma = cumsum(g); D_ij = exp(gamma_i - gamma_j) (j <= i)
//   P = (q k^T) . D (j <= i), A = beta_i (k k^T) . D (j < i)                    [c, c]
//   V' = (I + A)^-1 (beta (v - exp(gamma) k S))   (= U - W S: M is linear)      [c, cols]
//   O = exp(gamma) q S + P V',  S <- exp(gamma_c) S + (exp(gamma_c - gamma) k)^T V'
// so W [c, DK] is never formed: the forward substitution runs over the block's columns only,
// one warp, a lane a column, V' in registers. Shared memory (floats): q, k [kChunk, DK4 + 4]
// (normalised; rows padded so float4 reads of consecutive rows hit distinct banks),
// S [DK4, 32], PA [kChunk, 68] (P on and below the diagonal, A^T above it: row j of A^T is
// what the substitution reads after finishing row j), V' [kChunk, 36], gamma, beta,
// exp(gamma_c - gamma) [kChunk]: 188 KB at DK 256, 109 KB at DK 128 (two blocks an SM).
constexpr int kChunk = 64;  // transformers' chunk_size, as the CPU
constexpr int kCkCols = 32;
constexpr int kCkThreads = 256;
constexpr int kCkWarps = kCkThreads / kWarp;  // 8
constexpr int kCkRows = kChunk / kCkWarps;    // chunk rows a thread (warp + 8 r)
constexpr int kPaStride = kChunk + 4;         // A^T's column writes: 2-way conflicts
constexpr int kVpStride = kCkCols + 4;
constexpr int kSGroups = kMaxHeadDim / (4 * kCkWarps);  // float4 rows of S a thread at DK 256

__host__ __device__ __forceinline__ int Round4(int x) { return (x + 3) & ~3; }
__host__ __device__ __forceinline__ int KStride(int DK) { return Round4(DK) + 4; }
__host__ __device__ __forceinline__ int64_t ChunkSmemFloats(int DK) {
  return 2 * kChunk * KStride(DK) + Round4(DK) * kCkCols + kChunk * kPaStride + kChunk * kVpStride +
         3 * kChunk;
}

__device__ __forceinline__ float Dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

__device__ __forceinline__ float Elem(float4 v, int e) {
  return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

__global__ __launch_bounds__(kCkThreads, 2) void DeltaRuleChunkedKernel(DeltaRuleParams p) {
  WaitForPriorKernel();
  const SeqDev s = p.seqs[blockIdx.z];
  if (s.num_tokens <= 1) return;  // DeltaRuleWarpKernel's
  extern __shared__ float4 smem4[];
  const int DK = p.DK, DV = p.DV, dk4 = Round4(DK), ks = KStride(DK);
  float* qs = reinterpret_cast<float*>(smem4);
  float* kk = qs + kChunk * ks;
  float* Ss = kk + kChunk * ks;
  float* PA = Ss + dk4 * kCkCols;
  float* Vp = PA + kChunk * kPaStride;
  float* gam = Vp + kChunk * kVpStride;
  float* bet = gam + kChunk;
  float* ek = bet + kChunk;
  const int h = blockIdx.y, kh = h / (p.NV / p.NK);
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int col0 = blockIdx.x * kCkCols, j = col0 + lane;
  const bool has_col = j < DV;
  const int64_t C = 2 * static_cast<int64_t>(p.NK) * DK + static_cast<int64_t>(p.NV) * DV;
  const int64_t q_off = kh * DK, k_off = static_cast<int64_t>(p.NK) * DK + kh * DK;
  const int64_t v_off = 2 * static_cast<int64_t>(p.NK) * DK + h * DV + j;
  float* S = s.state + static_cast<int64_t>(h) * DK * DV;
  for (int e = tid; e < dk4 * kCkCols; e += kCkThreads) {
    const int d = e / kCkCols, cl = col0 + e % kCkCols;
    Ss[e] = d < DK && cl < DV ? S[static_cast<int64_t>(d) * DV + cl] : 0.f;
  }
  const float neg_a = -expf(LoadW(p.a_log, static_cast<DType>(p.a_log_type), h));
  const float dt = LoadW(p.dt_bias, static_cast<DType>(p.dt_bias_type), h);
  const float q_scale = 1.f / sqrtf(static_cast<float>(DK));

  for (int64_t c0 = 0; c0 < s.num_tokens; c0 += kChunk) {
    const int c = static_cast<int>(Min64(kChunk, s.num_tokens - c0));
    const float* xc = p.qkv + (s.row + c0) * C;
    // Raw q, k (rows warp + 8 r; all of a thread's loads in flight together), v of this
    // thread's rows and column (into V'), g and beta. Rows past c are zero and their g is 0 (gamma
    // stays gamma_c: every exp below stays finite).
    for (int d = lane; d < dk4; d += kWarp) {
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) {
        const int t = warp + kCkWarps * r;
        const bool in = t < c && d < DK;
        qs[t * ks + d] = in ? xc[t * C + q_off + d] : 0.f;
        kk[t * ks + d] = in ? xc[t * C + k_off + d] : 0.f;
      }
    }
#pragma unroll
    for (int r = 0; r < kCkRows; ++r) {
      const int i = warp + kCkWarps * r;
      Vp[i * kVpStride + lane] = has_col && i < c ? xc[i * C + v_off] : 0.f;
    }
    if (tid < kChunk) {
      float g = 0.f, beta = 0.f;
      if (tid < c) {
        const int64_t row = s.row + c0 + tid;
        beta = SigmoidOf(p.b[row * p.NV + h]);
        g = neg_a * Softplus(p.a[row * p.NV + h] + dt);
      }
      gam[tid] = g;
      bet[tid] = beta;
    }
    __syncthreads();
    if (tid == 0) {  // gamma = cumsum(g) in the CPU's order
      float gv[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) gv[i] = gam[i];
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) gam[i] = acc += gv[i];
    }
    // L2-normalise the rows (q also scaled by DK^-0.5): a warp's 8 rows' sums together.
    {
      float qsum[kCkRows], ksum[kCkRows];
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) qsum[r] = ksum[r] = 0.f;
      for (int d = lane; d < dk4; d += kWarp) {
#pragma unroll
        for (int r = 0; r < kCkRows; ++r) {
          const int t = warp + kCkWarps * r;
          const float qv = qs[t * ks + d], kv = kk[t * ks + d];
          qsum[r] = fmaf(qv, qv, qsum[r]);
          ksum[r] = fmaf(kv, kv, ksum[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) {
        qsum[r] = 1.f / sqrtf(WarpSum(qsum[r]) + 1e-6f) * q_scale;
        ksum[r] = 1.f / sqrtf(WarpSum(ksum[r]) + 1e-6f);
      }
      for (int d = lane; d < dk4; d += kWarp) {
#pragma unroll
        for (int r = 0; r < kCkRows; ++r) {
          const int t = warp + kCkWarps * r;
          qs[t * ks + d] *= qsum[r];
          kk[t * ks + d] *= ksum[r];
        }
      }
    }
    __syncthreads();

    // P and A: thread (ty, tx) has rows ty + 16 a and columns tx + 16 b.
    {
      const int ty = tid / 16, tx = tid % 16;
      float pa[4][4] = {}, aa[4][4] = {};
      for (int d = 0; d < dk4; d += 4) {
        float4 qi[4], ki[4], kj[4];
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          qi[a] = *reinterpret_cast<const float4*>(qs + (ty + 16 * a) * ks + d);
          ki[a] = *reinterpret_cast<const float4*>(kk + (ty + 16 * a) * ks + d);
          kj[a] = *reinterpret_cast<const float4*>(kk + (tx + 16 * a) * ks + d);
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) {
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            pa[a][b] = Dot4(qi[a], kj[b], pa[a][b]);
            aa[a][b] = Dot4(ki[a], kj[b], aa[a][b]);
          }
        }
      }
#pragma unroll
      for (int a = 0; a < 4; ++a) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = ty + 16 * a, jj = tx + 16 * b;
          if (jj <= i) {
            const float dec = expf(gam[i] - gam[jj]);
            PA[i * kPaStride + jj] = pa[a][b] * dec;
            if (jj < i) PA[jj * kPaStride + i] = bet[i] * aa[a][b] * dec;  // A^T
          }
        }
      }
    }
    // k S and q S for rows warp + 8 r, column lane; V' starts as beta (v - exp(gamma) k S).
    float o[kCkRows];
    {
      float aks[kCkRows] = {}, aqs[kCkRows] = {};
      for (int d = 0; d < dk4; d += 4) {
        const float s0 = Ss[d * kCkCols + lane], s1 = Ss[(d + 1) * kCkCols + lane];
        const float s2 = Ss[(d + 2) * kCkCols + lane], s3 = Ss[(d + 3) * kCkCols + lane];
        const float4 sv = make_float4(s0, s1, s2, s3);
#pragma unroll
        for (int r = 0; r < kCkRows; ++r) {
          const int i = warp + kCkWarps * r;
          aks[r] = Dot4(*reinterpret_cast<const float4*>(kk + i * ks + d), sv, aks[r]);
          aqs[r] = Dot4(*reinterpret_cast<const float4*>(qs + i * ks + d), sv, aqs[r]);
        }
      }
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) {
        const int i = warp + kCkWarps * r;
        const float eg = expf(gam[i]);
        o[r] = eg * aqs[r];
        Vp[i * kVpStride + lane] = bet[i] * (Vp[i * kVpStride + lane] - eg * aks[r]);
      }
      if (tid < kChunk) ek[tid] = expf(gam[kChunk - 1] - gam[tid]);
    }
    __syncthreads();

    // V' = (I + A)^-1 V' by forward substitution, warp 0, lane = column: once row jj is final
    // it leaves the rows below (A is zero on rows past c, so all 64 rows are safe to run).
    if (warp == 0) {
      float v[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = Vp[i * kVpStride + lane];
#pragma unroll
      for (int jj = 0; jj < kChunk - 1; ++jj) {
#pragma unroll
        for (int i4 = (jj + 1) / 4 * 4; i4 < kChunk; i4 += 4) {
          const float4 at = *reinterpret_cast<const float4*>(PA + jj * kPaStride + i4);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (i4 + e > jj) v[i4 + e] = fmaf(-Elem(at, e), v[jj], v[i4 + e]);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) Vp[i * kVpStride + lane] = v[i];
    }
    __syncthreads();

    // O = exp(gamma) q S + P V' (P: on and below the diagonal of PA; zero past c).
    {
      float acc[kCkRows];
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) acc[r] = o[r];
      for (int jj = 0; jj < c; jj += 4) {
        const float4 vv =
            make_float4(Vp[jj * kVpStride + lane], Vp[(jj + 1) * kVpStride + lane],
                        Vp[(jj + 2) * kVpStride + lane], Vp[(jj + 3) * kVpStride + lane]);
#pragma unroll
        for (int r = 0; r < kCkRows; ++r) {
          const int i = warp + kCkWarps * r;  // warp-uniform: no divergence
          if (jj <= i) {
            float4 pr = *reinterpret_cast<const float4*>(PA + i * kPaStride + jj);
            if (jj + 1 > i) pr.y = 0.f;
            if (jj + 2 > i) pr.z = 0.f;
            if (jj + 3 > i) pr.w = 0.f;
            acc[r] = Dot4(pr, vv, acc[r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kCkRows; ++r) {
        const int i = warp + kCkWarps * r;
        if (i < c && has_col) p.out[(s.row + c0 + i) * p.NV * DV + h * DV + j] = acc[r];
      }
    }
    // S <- exp(gamma_c) S + (exp(gamma_c - gamma) k)^T V': thread has rows 4 (warp + 8 m) .. +3
    // of column lane.
    {
      const float decay = expf(gam[kChunk - 1]);
      float sa[kSGroups][4];
#pragma unroll
      for (int m = 0; m < kSGroups; ++m) {
        const int d0 = 4 * (warp + kCkWarps * m);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sa[m][e] = d0 < dk4 ? decay * Ss[(d0 + e) * kCkCols + lane] : 0.f;
        }
      }
      for (int i = 0; i < c; ++i) {
        const float vi = ek[i] * Vp[i * kVpStride + lane];
#pragma unroll
        for (int m = 0; m < kSGroups; ++m) {
          const int d0 = 4 * (warp + kCkWarps * m);
          if (d0 < dk4) {
            const float4 kv = *reinterpret_cast<const float4*>(kk + i * ks + d0);
            sa[m][0] = fmaf(kv.x, vi, sa[m][0]);
            sa[m][1] = fmaf(kv.y, vi, sa[m][1]);
            sa[m][2] = fmaf(kv.z, vi, sa[m][2]);
            sa[m][3] = fmaf(kv.w, vi, sa[m][3]);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kSGroups; ++m) {
        const int d0 = 4 * (warp + kCkWarps * m);
        if (d0 < dk4) {
#pragma unroll
          for (int e = 0; e < 4; ++e) Ss[(d0 + e) * kCkCols + lane] = sa[m][e];
        }
      }
    }
    __syncthreads();  // S, q, k, gamma are read and rewritten by the next chunk
  }
  for (int e = tid; e < dk4 * kCkCols; e += kCkThreads) {
    const int d = e / kCkCols, cl = col0 + e % kCkCols;
    if (d < DK && cl < DV) S[static_cast<int64_t>(d) * DV + cl] = Ss[e];
  }
}

// The call's sequences as SeqDev rows (host), `state` picking the conv or the recurrent state;
// checks that their tokens are T = rows.
template <typename Pick>
std::vector<SeqDev> SeqTable(absl::Span<const LinearAttnSeq> seqs, Pick state) {
  std::vector<SeqDev> table;
  table.reserve(seqs.size());
  int64_t row = 0;
  for (const LinearAttnSeq& s : seqs) {
    MOE_CHECK(s.num_tokens >= 0) << "linear attention: sequence of " << s.num_tokens << " tokens";
    table.push_back(SeqDev{row, s.num_tokens, state(s)});
    row += s.num_tokens;
  }
  return table;
}

}  // namespace
}  // namespace moe::kernels::cuda

namespace moe::kernels {

void CudaBackend::MulSigmoid(float* x, const float* gate, int64_t n) {
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>(
      std::clamp<int64_t>(cuda::CeilDiv(n, cuda::kThreads), 1, int64_t{num_sms_} * 16));
  cuda::Launch(cuda::MulSigmoidKernel, grid, cuda::kThreads, 0, stream_, x, gate, n);
}

void CudaBackend::Mul(float* out, const float* a, const float* b, int64_t n) {
  if (n == 0) return;
  const unsigned grid = static_cast<unsigned>(
      std::clamp<int64_t>(cuda::CeilDiv(n, cuda::kThreads), 1, int64_t{num_sms_} * 16));
  cuda::Launch(cuda::MulKernel, grid, cuda::kThreads, 0, stream_, out, a, b, n);
}

void CudaBackend::GatedRmsNorm(float* out, const float* x, const float* z, int64_t rows,
                               const TensorView& weight, float eps) {
  const int64_t n = weight.numel();
  MOE_CHECK(n > 0 && rows >= 0 && rows <= 0x7fffffff)
      << "GatedRmsNorm: rows " << rows << " n " << n;
  cuda::CheckDense(weight, "GatedRmsNorm");
  if (rows == 0) return;
  // Rows of GatedDeltaNet are one value head (DV 128): a small block keeps every thread busy.
  const int threads = static_cast<int>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, 256));
  cuda::Launch(cuda::GatedRmsNormKernel, dim3(static_cast<unsigned>(rows)), threads, 0, stream_,
               out, x, z, n, weight.data, weight.dtype, eps);
}

void CudaBackend::CausalConv(const CausalConvArgs& a) {
  const int64_t C = a.channels;
  const int KW = a.kernel_size;
  MOE_CHECK(KW >= 2 && KW <= cuda::kMaxConvWidth && a.weight.numel() == C * KW)
      << "CausalConv: weight of " << a.weight.numel() << " for " << C << " channels of width " << KW
      << " (the GPU takes widths 2.." << cuda::kMaxConvWidth << ")";
  cuda::CheckDense(a.weight, "CausalConv");
  if (a.bias.data != nullptr) {
    MOE_CHECK(a.bias.numel() == C)
        << "CausalConv: bias of " << a.bias.numel() << " for " << C << " channels";
    cuda::CheckDense(a.bias, "CausalConv bias");
  }
  MOE_CHECK(a.seqs.size() <= 65535) << "CausalConv: " << a.seqs.size() << " sequences";
  if (a.seqs.empty() || C == 0) return;
  const std::vector<cuda::SeqDev> table =
      cuda::SeqTable(a.seqs, [](const LinearAttnSeq& s) { return s.conv_state; });
  int64_t longest = 0;
  for (const cuda::SeqDev& s : table) longest = std::max(longest, s.num_tokens);
  const int64_t runs = cuda::CeilDiv(longest, cuda::kConvRun);
  MOE_CHECK(runs <= 65535) << "CausalConv: a sequence of " << longest << " tokens";
  if (runs == 0) return;
  const auto* dev = static_cast<const cuda::SeqDev*>(
      StageHostArgs(linear_seqs_, table.data(), table.size() * sizeof(cuda::SeqDev)));
  const unsigned channel_blocks = static_cast<unsigned>(cuda::CeilDiv(C, cuda::kThreads));
  const dim3 grid(channel_blocks, static_cast<unsigned>(runs), static_cast<unsigned>(table.size()));
  cuda::Launch(cuda::CausalConvKernel, grid, cuda::kThreads, 0, stream_, a.out, a.x, a.weight.data,
               a.weight.dtype, a.bias.data, a.bias.dtype, a.silu, C, KW, dev);
  if (runs > 1) {
    cuda::Launch(cuda::CausalConvStateKernel,
                 dim3(channel_blocks, static_cast<unsigned>(table.size())), cuda::kThreads, 0,
                 stream_, a.x, C, KW, dev);
  }
}

void CudaBackend::GatedDeltaRule(const GatedDeltaRuleArgs& a) {
  const int NK = a.num_k_heads, NV = a.num_v_heads, DK = a.k_head_dim, DV = a.v_head_dim;
  MOE_CHECK(NK > 0 && NV % NK == 0 && NV <= 65535)
      << "GatedDeltaRule: " << NV << " value heads, " << NK << " key heads";
  MOE_CHECK(DK > 0 && DK <= cuda::kMaxHeadDim && DV > 0 && DV <= cuda::kMaxHeadDim)
      << "GatedDeltaRule: head dims " << DK << ", " << DV << " (the GPU takes 1.."
      << cuda::kMaxHeadDim << ")";
  MOE_CHECK(a.a_log.numel() == NV && a.dt_bias.numel() == NV)
      << "GatedDeltaRule: a_log of " << a.a_log.numel() << ", dt_bias of " << a.dt_bias.numel()
      << " for " << NV << " value heads";
  cuda::CheckDense(a.a_log, "GatedDeltaRule a_log");
  cuda::CheckDense(a.dt_bias, "GatedDeltaRule dt_bias");
  MOE_CHECK(a.seqs.size() <= 65535) << "GatedDeltaRule: " << a.seqs.size() << " sequences";
  if (a.seqs.empty()) return;
  const std::vector<cuda::SeqDev> table =
      cuda::SeqTable(a.seqs, [](const LinearAttnSeq& s) { return s.state; });
  cuda::DeltaRuleParams p{};
  p.out = a.out;
  p.qkv = a.qkv;
  p.b = a.b;
  p.a = a.a;
  p.a_log = a.a_log.data;
  p.dt_bias = a.dt_bias.data;
  p.a_log_type = static_cast<int32_t>(a.a_log.dtype);
  p.dt_bias_type = static_cast<int32_t>(a.dt_bias.dtype);
  p.NK = NK;
  p.NV = NV;
  p.DK = DK;
  p.DV = DV;
  p.seqs = static_cast<const cuda::SeqDev*>(
      StageHostArgs(linear_seqs_, table.data(), table.size() * sizeof(cuda::SeqDev)));
  // One-token sequences (decode) take the recurrent kernel, longer ones the chunked kernel; each
  // kernel's blocks for the other's sequences return at once.
  bool any_step = false, any_chunked = false;
  for (const cuda::SeqDev& s : table) (s.num_tokens > 1 ? any_chunked : any_step) = true;
  if (any_step) {
    const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(DV, cuda::kTileCols)),
                    static_cast<unsigned>(NV), static_cast<unsigned>(table.size()));
    cuda::Launch(cuda::DeltaRuleWarpKernel, grid, cuda::kWarp * cuda::kWarpsPerBlock, 0, stream_,
                 p);
  }
  if (any_chunked) {
    const size_t smem = static_cast<size_t>(cuda::ChunkSmemFloats(DK)) * sizeof(float);
    MOE_CUDA_CHECK(cudaFuncSetAttribute(cuda::DeltaRuleChunkedKernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    // All of the SM's memory as shared memory: two blocks of 109 KB (DK 128) fit.
    MOE_CUDA_CHECK(cudaFuncSetAttribute(cuda::DeltaRuleChunkedKernel,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(DV, cuda::kCkCols)),
                    static_cast<unsigned>(NV), static_cast<unsigned>(table.size()));
    cuda::Launch(cuda::DeltaRuleChunkedKernel, grid, cuda::kCkThreads, smem, stream_, p);
  }
}

}  // namespace moe::kernels
