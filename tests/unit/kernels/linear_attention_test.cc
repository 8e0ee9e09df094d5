// The CPU GatedDeltaRule's two forms agree: a sequence of n tokens in one call (the chunked form,
// chunks of 64) gives what n one-token calls (the recurrent step) give, outputs and state, and a
// prompt split across calls gives what it gives at once.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {
namespace {

constexpr int NK = 3, NV = 6, DK = 20, DV = 12;
constexpr int64_t C = 2 * NK * DK + NV * DV;

std::vector<float> Random(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Inputs of one sequence of n tokens and a non-zero starting state.
struct Inputs {
  int64_t n;
  std::vector<float> qkv, b, a, a_log, dt_bias, state;
  Inputs(int64_t tokens, uint32_t seed) : n(tokens) {
    std::mt19937 rng(seed);
    qkv = Random(n * C, rng, -1.f, 1.f);
    b = Random(n * NV, rng, -3.f, 3.f);
    a = Random(n * NV, rng, -3.f, 0.f);  // g in about [-1, 0), as the parity test
    a_log = Random(NV, rng, -2.f, 0.f);
    dt_bias = Random(NV, rng, -1.f, 0.5f);
    state = Random(NV * DK * DV, rng, -0.5f, 0.5f);
  }
};

// Runs rows [begin, begin + count) of `in` as one sequence in one call, on `state`.
void RunRows(CpuBackend& cpu, const Inputs& in, int64_t begin, int64_t count,
             std::vector<float>& state, float* out) {
  LinearAttnSeq seq{count, nullptr, state.data()};
  GatedDeltaRuleArgs a;
  a.out = out + begin * NV * DV;
  a.qkv = in.qkv.data() + begin * C;
  a.b = in.b.data() + begin * NV;
  a.a = in.a.data() + begin * NV;
  a.a_log = View(in.a_log.data(), DType::kF32, {NV});
  a.dt_bias = View(in.dt_bias.data(), DType::kF32, {NV});
  a.num_k_heads = NK;
  a.num_v_heads = NV;
  a.k_head_dim = DK;
  a.v_head_dim = DV;
  a.seqs = absl::MakeConstSpan(&seq, 1);
  cpu.GatedDeltaRule(a);
}

// Largest |got - want| / max(|want|, rms(want)) (parity_util.h's measure).
double MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double sq = 0;
  for (float w : want) sq += double(w) * w;
  const double rms = std::sqrt(sq / std::max<size_t>(1, want.size()));
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err =
        std::abs(double(got[i]) - want[i]) / std::max(std::abs(double(want[i])), rms);
    worst = std::max(worst, std::isfinite(err) ? err : 1e30);
  }
  return worst;
}

TEST(LinearAttentionTest, ChunkedFormEqualsRecurrentSteps) {
  CpuBackend cpu(1);
  for (int64_t n : {2, 7, 64, 65, 70, 130}) {
    const Inputs in(n, static_cast<uint32_t>(n));
    std::vector<float> chunked_state = in.state, steps_state = in.state;
    std::vector<float> chunked(n * NV * DV), steps(n * NV * DV);
    RunRows(cpu, in, 0, n, chunked_state, chunked.data());
    for (int64_t t = 0; t < n; ++t) RunRows(cpu, in, t, 1, steps_state, steps.data());
    EXPECT_LT(MaxRelError(chunked, steps), 1e-5) << n << " tokens: outputs";
    EXPECT_LT(MaxRelError(chunked_state, steps_state), 1e-5) << n << " tokens: state";
  }
}

TEST(LinearAttentionTest, SplitPrefillEqualsWholePrefill) {
  CpuBackend cpu(1);
  const Inputs in(70, 70);
  std::vector<float> whole_state = in.state, split_state = in.state;
  std::vector<float> whole(70 * NV * DV), split(70 * NV * DV);
  RunRows(cpu, in, 0, 70, whole_state, whole.data());
  RunRows(cpu, in, 0, 7, split_state, split.data());
  RunRows(cpu, in, 7, 63, split_state, split.data());
  EXPECT_LT(MaxRelError(split, whole), 1e-5);
  EXPECT_LT(MaxRelError(split_state, whole_state), 1e-5);
}

}  // namespace
}  // namespace moe::kernels
