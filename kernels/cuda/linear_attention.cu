// GatedDeltaNet on the GPU (backend.h: MulSigmoid, GatedRmsNorm, CausalConv, GatedDeltaRule; Mul
// and CausalConv without SiLU also serve LFM2's short conv); the CPU reference is
// cpu/linear_attention.cc.
//
// The per-sequence spans (host memory) are staged once per call as a small device table
// (StageHostArgs, so a recorded step copies it from the step graph's arena and stays
// replayable). Every kernel reads the sequences from that table: nothing here synchronises.
//
// GatedDeltaRule runs the recurrent step for every token, prefill included: one block per
// (sequence, value head, 32 columns of S), the block's S columns held in registers across the
// sequence's tokens, so S is read once and written once per call. backend.h allows this: the
// chunked form of the CPU reference is the same function to fp32 rounding (parity: 2.5e-6).
// Two kernels: DeltaRuleWarpKernel (default: each warp owns 8 columns, no block barrier per
// token) and DeltaRuleRecurrentKernel (MOE_GDN_KERNEL=block: 8 warps split DK, block-wide
// sums). H200, NK 16, NV 32, DK = DV = 128 (tests/gpu_results/gdn_parity_stop39.txt): decode of
// 64 sequences 142 vs 174 us (1.9 TB/s of state), one sequence 7.2 vs 5.9 us; a 4096-token
// prompt 8.4 vs 10.4 ms (~2 us a token, sequential). Long prompts want the chunked form on the
// tensor cores (future work), and CausalConv's prefill (2.3 ms at 4096 tokens: a thread walks
// a channel's whole sequence) wants time-parallel threads.
#include <algorithm>
#include <cstdlib>
#include <string_view>
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

// One thread per (sequence, channel) walking the sequence's tokens; grid (channel blocks, seqs).
// The window is win[kMaxConvWidth - KW ..): the KW - 1 previous inputs, oldest first, then the
// current one; constant indices keep it in registers for any KW <= kMaxConvWidth.
// bias (dtype bt) is null without one; silu: the activation after the sum (GatedDeltaNet) or
// none (LFM2's short conv).
__global__ void CausalConvKernel(float* out, const float* x, const void* weight, DType wt,
                                 const void* bias, DType bt, bool silu, int64_t C, int KW,
                                 const SeqDev* seqs) {
  WaitForPriorKernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const SeqDev s = seqs[blockIdx.y];
  constexpr int kM = kMaxConvWidth;
  const int first = kM - KW;  // window slot of weight 0
  float w[kM], win[kM];
#pragma unroll
  for (int i = 0; i < kM; ++i) {
    w[i] = i >= first ? LoadW(weight, wt, c * KW + (i - first)) : 0.f;
    win[i] = i >= first && i < kM - 1 ? s.state[c * (KW - 1) + (i - first)] : 0.f;
  }
  for (int64_t t = 0; t < s.num_tokens; ++t) {
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
#pragma unroll
  for (int i = 0; i < kM - 1; ++i) {
    if (i >= first) s.state[c * (KW - 1) + (i - first)] = win[i];
  }
}

// The recurrent delta rule. Block (column tile, value head h, sequence): lane l of warp w owns
// column j = 32 * blockIdx.x + l of S [DK, DV] at rows w, w + 8, w + 16, ... (kDrRows at most,
// registers), so each warp's loads and stores of S are one 128-byte row segment.
constexpr int kDrCols = 32;
constexpr int kDrWarps = kThreads / kWarp;  // 8
constexpr int kMaxHeadDim = 256;
constexpr int kDrRows = kMaxHeadDim / kDrWarps;  // 32

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

__global__ __launch_bounds__(kThreads) void DeltaRuleRecurrentKernel(DeltaRuleParams p) {
  WaitForPriorKernel();
  __shared__ float qs[kMaxHeadDim], ks[kMaxHeadDim];
  __shared__ float red[kDrWarps][kDrCols];
  const SeqDev s = p.seqs[blockIdx.z];
  const int h = blockIdx.y, kh = h / (p.NV / p.NK);
  const int DK = p.DK, DV = p.DV;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int j = blockIdx.x * kDrCols + lane;
  const bool has_col = j < DV;
  const int64_t C = 2 * static_cast<int64_t>(p.NK) * DK + static_cast<int64_t>(p.NV) * DV;
  float* S = s.state + static_cast<int64_t>(h) * DK * DV;

  float sreg[kDrRows];
#pragma unroll
  for (int r = 0; r < kDrRows; ++r) {
    const int i = warp + kDrWarps * r;
    sreg[r] = has_col && i < DK ? S[static_cast<int64_t>(i) * DV + j] : 0.f;
  }
  const float neg_a = -expf(LoadW(p.a_log, static_cast<DType>(p.a_log_type), h));
  const float dt = LoadW(p.dt_bias, static_cast<DType>(p.dt_bias_type), h);
  const float q_scale = 1.f / sqrtf(static_cast<float>(DK));

  for (int64_t t = 0; t < s.num_tokens; ++t) {
    const int64_t row = s.row + t;
    const float* x = p.qkv + row * C;
    // q, k of key head kh, L2-normalised (DK <= blockDim: one element a thread).
    const int d = threadIdx.x;
    const float qv = d < DK ? x[kh * DK + d] : 0.f;
    const float kv = d < DK ? x[static_cast<int64_t>(p.NK) * DK + kh * DK + d] : 0.f;
    const float qsum = BlockSum(qv * qv);
    const float ksum = BlockSum(kv * kv);
    if (d < DK) {
      qs[d] = qv * (1.f / sqrtf(qsum + 1e-6f) * q_scale);
      ks[d] = kv * (1.f / sqrtf(ksum + 1e-6f));
    }
    const float beta = SigmoidOf(p.b[row * p.NV + h]);
    const float decay = expf(neg_a * Softplus(p.a[row * p.NV + h] + dt));
    __syncthreads();
    // S <- decay S;  e = beta (v - S^T k)
    float part = 0.f;
#pragma unroll
    for (int r = 0; r < kDrRows; ++r) {
      const int i = warp + kDrWarps * r;
      if (i < DK) {
        sreg[r] *= decay;
        part = fmaf(sreg[r], ks[i], part);
      }
    }
    red[warp][lane] = part;
    __syncthreads();
    float e = 0.f;
#pragma unroll
    for (int w = 0; w < kDrWarps; ++w) e += red[w][lane];
    const float v = has_col ? x[2 * static_cast<int64_t>(p.NK) * DK + h * DV + j] : 0.f;
    e = beta * (v - e);
    __syncthreads();  // every warp has read red
    // S <- S + k e^T;  out = S^T q
    part = 0.f;
#pragma unroll
    for (int r = 0; r < kDrRows; ++r) {
      const int i = warp + kDrWarps * r;
      if (i < DK) {
        sreg[r] = fmaf(ks[i], e, sreg[r]);
        part = fmaf(sreg[r], qs[i], part);
      }
    }
    red[warp][lane] = part;
    __syncthreads();
    if (warp == 0 && has_col) {
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < kDrWarps; ++w) o += red[w][lane];
      p.out[row * p.NV * DV + h * DV + j] = o;
    }
    __syncthreads();  // red, qs and ks are rewritten by the next token
  }
#pragma unroll
  for (int r = 0; r < kDrRows; ++r) {
    const int i = warp + kDrWarps * r;
    if (has_col && i < DK) S[static_cast<int64_t>(i) * DV + j] = sreg[r];
  }
}

// The recurrent delta rule, warp by warp: warp w of block (column tile, value head h, sequence)
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
  const auto* dev = static_cast<const cuda::SeqDev*>(
      StageHostArgs(linear_seqs_, table.data(), table.size() * sizeof(cuda::SeqDev)));
  const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(C, cuda::kThreads)),
                  static_cast<unsigned>(table.size()));
  cuda::Launch(cuda::CausalConvKernel, grid, cuda::kThreads, 0, stream_, a.out, a.x, a.weight.data,
               a.weight.dtype, a.bias.data, a.bias.dtype, a.silu, C, KW, dev);
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
  const dim3 grid(static_cast<unsigned>(cuda::CeilDiv(DV, cuda::kTileCols)),
                  static_cast<unsigned>(NV), static_cast<unsigned>(table.size()));
  // MOE_GDN_KERNEL=block: the block-reduction kernel (A/B measurement against the warp one).
  static const bool block_kernel = [] {
    const char* v = std::getenv("MOE_GDN_KERNEL");
    return v != nullptr && std::string_view(v) == "block";
  }();
  if (block_kernel) {
    cuda::Launch(cuda::DeltaRuleRecurrentKernel, grid, cuda::kThreads, 0, stream_, p);
  } else {
    cuda::Launch(cuda::DeltaRuleWarpKernel, grid, cuda::kWarp * cuda::kWarpsPerBlock, 0, stream_,
                 p);
  }
}

}  // namespace moe::kernels
