// GatedDeltaNet on the CPU (backend.h: CausalConv, GatedDeltaRule, GatedRmsNorm, MulSigmoid; Mul
// and CausalConv without SiLU also serve LFM2's short conv): the reference for the CUDA kernels.
// Prefill runs the chunked form of the delta rule as
// transformers does (chunks of 64 positions), decode the recurrent step.
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {
namespace {

float Silu(float x) { return x / (1.f + std::exp(-x)); }
float SigmoidOf(float x) { return 1.f / (1.f + std::exp(-x)); }
// torch.nn.functional.softplus (beta 1, threshold 20)
float Softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// x / sqrt(sum x^2 + 1e-6) * scale over n values (the eps inside the root, added to the sum).
void L2Normalize(float* x, int n, float scale) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.f / std::sqrt(sum + 1e-6f) * scale;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

constexpr int kChunk = 64;  // transformers' chunk_size

// One value head of one sequence over n tokens: q, k [n, DK] (normalised), v [n, DV], beta and
// g [n]; S [DK, DV] in place; out [n, DV] (row stride out_stride).
void RecurrentHead(int n, int DK, int DV, const float* q, const float* k, const float* v,
                   const float* beta, const float* g, float* S, float* out, int64_t out_stride) {
  std::vector<float> e(DV);
  for (int t = 0; t < n; ++t) {
    const float decay = std::exp(g[t]);
    for (int i = 0; i < DK * DV; ++i) S[i] *= decay;
    const float* kt = k + t * DK;
    for (int j = 0; j < DV; ++j) e[j] = 0.f;
    for (int i = 0; i < DK; ++i) {
      for (int j = 0; j < DV; ++j) e[j] += S[i * DV + j] * kt[i];
    }
    for (int j = 0; j < DV; ++j) e[j] = beta[t] * (v[t * DV + j] - e[j]);
    for (int i = 0; i < DK; ++i) {
      for (int j = 0; j < DV; ++j) S[i * DV + j] += kt[i] * e[j];
    }
    float* o = out + t * out_stride;
    const float* qt = q + t * DK;
    for (int j = 0; j < DV; ++j) o[j] = 0.f;
    for (int i = 0; i < DK; ++i) {
      for (int j = 0; j < DV; ++j) o[j] += S[i * DV + j] * qt[i];
    }
  }
}

// The chunked form (architectures.md §1.6), chunk by chunk: within a chunk of c positions,
//   gamma = cumsum(g), D_ij = exp(gamma_i - gamma_j) (j <= i), A_ij = beta_i k_i.k_j D_ij (j < i),
//   M = (I + A)^-1, U = M (beta v), W = M (beta exp(gamma) k), V' = U - W S,
//   O = (exp(gamma) q) S + ((q k^T) . D) V',  S <- exp(gamma_c) S + (exp(gamma_c - gamma) k)^T V'.
void ChunkedHead(int n, int DK, int DV, const float* q, const float* k, const float* v,
                 const float* beta, const float* g, float* S, float* out, int64_t out_stride) {
  std::vector<float> gamma(kChunk), A(kChunk * kChunk), U(kChunk * DV), W(kChunk * DK),
      Vp(kChunk * DV);
  for (int c0 = 0; c0 < n; c0 += kChunk) {
    const int c = std::min(kChunk, n - c0);
    const float* qc = q + c0 * DK;
    const float* kc = k + c0 * DK;
    const float* vc = v + c0 * DV;
    const float* bc = beta + c0;
    float acc = 0.f;
    for (int i = 0; i < c; ++i) gamma[i] = acc += g[c0 + i];
    auto dot_k = [&](const float* a, const float* b) {
      float s = 0.f;
      for (int d = 0; d < DK; ++d) s += a[d] * b[d];
      return s;
    };
    // A (strictly lower), then forward substitution for U and W: row i of M X is
    // X_i - sum_{j<i} A_ij (M X)_j.
    for (int i = 0; i < c; ++i) {
      for (int j = 0; j < i; ++j) {
        A[i * kChunk + j] = bc[i] * dot_k(kc + i * DK, kc + j * DK) * std::exp(gamma[i] - gamma[j]);
      }
    }
    for (int i = 0; i < c; ++i) {
      for (int d = 0; d < DV; ++d) U[i * DV + d] = bc[i] * vc[i * DV + d];
      const float scale = bc[i] * std::exp(gamma[i]);
      for (int d = 0; d < DK; ++d) W[i * DK + d] = scale * kc[i * DK + d];
      for (int j = 0; j < i; ++j) {
        const float a = A[i * kChunk + j];
        for (int d = 0; d < DV; ++d) U[i * DV + d] -= a * U[j * DV + d];
        for (int d = 0; d < DK; ++d) W[i * DK + d] -= a * W[j * DK + d];
      }
    }
    // V' = U - W S
    for (int i = 0; i < c; ++i) {
      for (int d = 0; d < DV; ++d) Vp[i * DV + d] = U[i * DV + d];
      for (int e = 0; e < DK; ++e) {
        const float w = W[i * DK + e];
        for (int d = 0; d < DV; ++d) Vp[i * DV + d] -= w * S[e * DV + d];
      }
    }
    // O = (exp(gamma) q) S + ((q k^T) . D) V'
    for (int i = 0; i < c; ++i) {
      float* o = out + (c0 + i) * out_stride;
      const float eg = std::exp(gamma[i]);
      for (int d = 0; d < DV; ++d) o[d] = 0.f;
      for (int e = 0; e < DK; ++e) {
        const float qe = eg * qc[i * DK + e];
        for (int d = 0; d < DV; ++d) o[d] += qe * S[e * DV + d];
      }
      for (int j = 0; j <= i; ++j) {
        const float w = dot_k(qc + i * DK, kc + j * DK) * std::exp(gamma[i] - gamma[j]);
        for (int d = 0; d < DV; ++d) o[d] += w * Vp[j * DV + d];
      }
    }
    // S <- exp(gamma_last) S + (exp(gamma_last - gamma) k)^T V'
    const float last = gamma[c - 1];
    const float decay = std::exp(last);
    for (int i = 0; i < DK * DV; ++i) S[i] *= decay;
    for (int j = 0; j < c; ++j) {
      const float w = std::exp(last - gamma[j]);
      for (int e = 0; e < DK; ++e) {
        const float ke = w * kc[j * DK + e];
        for (int d = 0; d < DV; ++d) S[e * DV + d] += ke * Vp[j * DV + d];
      }
    }
  }
}

}  // namespace

void CpuBackend::MulSigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= SigmoidOf(gate[i]);
}

void CpuBackend::Mul(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void CpuBackend::GatedRmsNorm(float* out, const float* x, const float* z, int64_t rows,
                              const TensorView& weight, float eps) {
  const int64_t n = weight.numel();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) sum += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      out[r * n + i] = xr[i] * inv * weight.at(i) * Silu(z[r * n + i]);
    }
  }
}

void CpuBackend::CausalConv(const CausalConvArgs& a) {
  const int64_t C = a.channels;
  const int KW = a.kernel_size;
  MOE_CHECK(KW >= 2 && a.weight.numel() == C * KW) << "CausalConv: weight of " << a.weight.numel()
                                                   << " for " << C << " channels of width " << KW;
  const bool has_bias = a.bias.data != nullptr;
  MOE_CHECK(!has_bias || a.bias.numel() == C)
      << "CausalConv: bias of " << a.bias.numel() << " for " << C << " channels";
  int64_t row = 0;
  std::vector<float> window(KW);
  for (const LinearAttnSeq& s : a.seqs) {
    for (int64_t c = 0; c < C; ++c) {
      float* state = s.conv_state + c * (KW - 1);  // oldest first
      for (int j = 0; j < KW - 1; ++j) window[j] = state[j];
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        window[KW - 1] = a.x[(row + t) * C + c];
        float acc = 0.f;
        for (int j = 0; j < KW; ++j) acc += a.weight.at(c * KW + j) * window[j];
        if (has_bias) acc += a.bias.at(c);
        a.out[(row + t) * C + c] = a.silu ? Silu(acc) : acc;
        for (int j = 0; j < KW - 1; ++j) window[j] = window[j + 1];
      }
      for (int j = 0; j < KW - 1; ++j) state[j] = window[j];
    }
    row += s.num_tokens;
  }
}

void CpuBackend::GatedDeltaRule(const GatedDeltaRuleArgs& a) {
  const int NK = a.num_k_heads, NV = a.num_v_heads, DK = a.k_head_dim, DV = a.v_head_dim;
  MOE_CHECK(NK > 0 && NV % NK == 0)
      << "GatedDeltaRule: " << NV << " value heads, " << NK << " key heads";
  const int r = NV / NK;
  const int64_t C = 2 * NK * DK + NV * DV;
  const float q_scale = 1.f / std::sqrt(static_cast<float>(DK));
  int64_t row = 0;
  for (const LinearAttnSeq& s : a.seqs) {
    const int n = static_cast<int>(s.num_tokens);
    std::vector<float> q(n * DK), k(n * DK), v(n * DV), beta(n), g(n);
    for (int h = 0; h < NV; ++h) {
      const int kh = h / r;  // repeat_interleave: value heads of one key head are adjacent
      for (int t = 0; t < n; ++t) {
        const float* x = a.qkv + (row + t) * C;
        for (int d = 0; d < DK; ++d) {
          q[t * DK + d] = x[kh * DK + d];
          k[t * DK + d] = x[NK * DK + kh * DK + d];
        }
        L2Normalize(&q[t * DK], DK, q_scale);
        L2Normalize(&k[t * DK], DK, 1.f);
        for (int d = 0; d < DV; ++d) v[t * DV + d] = x[2 * NK * DK + h * DV + d];
        beta[t] = SigmoidOf(a.b[(row + t) * NV + h]);
        g[t] = -std::exp(a.a_log.at(h)) * Softplus(a.a[(row + t) * NV + h] + a.dt_bias.at(h));
      }
      float* S = s.state + static_cast<int64_t>(h) * DK * DV;
      float* out = a.out + row * NV * DV + h * DV;
      if (n == 1) {
        RecurrentHead(n, DK, DV, q.data(), k.data(), v.data(), beta.data(), g.data(), S, out,
                      NV * DV);
      } else {
        ChunkedHead(n, DK, DV, q.data(), k.data(), v.data(), beta.data(), g.data(), S, out,
                    NV * DV);
      }
    }
    row += s.num_tokens;
  }
}

}  // namespace moe::kernels
