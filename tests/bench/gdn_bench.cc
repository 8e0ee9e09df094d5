// GatedDeltaRule and CausalConv on the GPU at Qwen3-Next's shape (NK 16, NV 32, DK = DV 128,
// conv width 4 over 2 NK DK + NV DV = 8192 channels) and the 397B's (NV 64): time per call, and
// for decode the state bandwidth (S read and written once: 2 NV DK DV 4 bytes a sequence)
// against the HBM ceiling. Inputs are random (zeros can time faster than real data), with the
// decays of real checkpoints.
// Usage: gdn_bench (no flags; a CUDA device).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/backend.h"

namespace {

using moe::kernels::Backend;
using moe::kernels::DeviceTensor;
using moe::kernels::DType;

constexpr int DK = 128, DV = 128, KW = 4;

// n values uniform in [lo, hi) from a fixed hash (fast enough for 50M values).
std::vector<float> Random(int64_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = lo + (hi - lo) * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
  }
  return v;
}

DeviceTensor Up(Backend& gpu, const std::vector<float>& v) {
  return gpu.Upload(moe::kernels::View(v.data(), DType::kF32, {static_cast<int64_t>(v.size())}))
      .value();
}

// Mean microseconds of `reps` calls of fn after a warm-up call.
template <typename Fn>
double Time(Backend& gpu, int reps, Fn fn) {
  fn();
  gpu.Synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  gpu.Synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / reps;
}

void Run(Backend& gpu, int NK, int NV, int num_seqs, int64_t tokens_per_seq) {
  const int64_t C = 2 * NK * DK + NV * DV;
  const int64_t T = num_seqs * tokens_per_seq;
  DeviceTensor qkv = Up(gpu, Random(T * C, -1.f, 1.f, 1));
  DeviceTensor conv_out = Up(gpu, std::vector<float>(T * C));
  DeviceTensor b = Up(gpu, Random(T * NV, -3.f, 3.f, 2)), a = Up(gpu, Random(T * NV, -3.f, 0.f, 3));
  DeviceTensor out = Up(gpu, std::vector<float>(T * NV * DV));
  DeviceTensor states = Up(gpu, Random(int64_t{num_seqs} * NV * DK * DV, -0.5f, 0.5f, 4));
  DeviceTensor conv_states = Up(gpu, Random(num_seqs * C * (KW - 1), -0.5f, 0.5f, 5));
  DeviceTensor a_log = Up(gpu, Random(NV, -2.f, 0.f, 6)),
               dt_bias = Up(gpu, Random(NV, -1.f, .5f, 7));
  const std::vector<float> conv_w = Random(C * KW, -0.5f, 0.5f, 8);
  DeviceTensor w = gpu.Upload(moe::kernels::View(conv_w.data(), DType::kF32, {C, 1, KW})).value();
  std::vector<moe::kernels::LinearAttnSeq> seqs(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    seqs[s].num_tokens = tokens_per_seq;
    seqs[s].state = static_cast<float*>(states.storage.data()) + int64_t{s} * NV * DK * DV;
    seqs[s].conv_state = static_cast<float*>(conv_states.storage.data()) + s * C * (KW - 1);
  }
  moe::kernels::GatedDeltaRuleArgs g;
  g.out = static_cast<float*>(out.storage.data());
  g.qkv = static_cast<const float*>(qkv.storage.data());
  g.b = static_cast<const float*>(b.storage.data());
  g.a = static_cast<const float*>(a.storage.data());
  g.a_log = a_log.view;
  g.dt_bias = dt_bias.view;
  g.num_k_heads = NK;
  g.num_v_heads = NV;
  g.k_head_dim = DK;
  g.v_head_dim = DV;
  g.seqs = seqs;
  moe::kernels::CausalConvArgs c;
  c.out = static_cast<float*>(conv_out.storage.data());
  c.x = static_cast<const float*>(qkv.storage.data());
  c.weight = w.view;
  c.channels = C;
  c.kernel_size = KW;
  c.seqs = seqs;
  const int reps = T > 1024 ? 5 : 50;
  const double rule_us = Time(gpu, reps, [&] { gpu.GatedDeltaRule(g); });
  const double conv_us = Time(gpu, reps, [&] { gpu.CausalConv(c); });
  const double state_gb = 2.0 * num_seqs * NV * DK * DV * 4 / 1e9;
  std::printf(
      "NV %2d seqs %3d x %5lld tokens: GatedDeltaRule %9.1f us (%6.1f ns/token/seq; state %6.0f "
      "GB/s)  CausalConv %8.1f us\n",
      NV, num_seqs, static_cast<long long>(tokens_per_seq), rule_us,
      rule_us * 1e3 / static_cast<double>(tokens_per_seq), state_gb / (rule_us * 1e-6), conv_us);
}

}  // namespace

int main() {
  auto gpu = moe::kernels::MakeBackend(moe::kernels::BackendKind::kCuda, {});
  if (!gpu.ok()) {
    std::fprintf(stderr, "gdn_bench: %s\n", gpu.status().ToString().c_str());
    return 2;
  }
  std::printf("GatedDeltaNet NK 16 DK %d DV %d KW %d (H100 HBM3 ~3350 GB/s, H200 ~4800)\n", DK, DV,
              KW);
  for (int seqs : {1, 8, 64, 256}) Run(**gpu, 16, 32, seqs, 1);
  Run(**gpu, 16, 32, 1, 64);
  Run(**gpu, 16, 32, 8, 512);
  // Prefill: one prompt (time to first token).
  for (int nv : {32, 64}) {
    for (int64_t tokens : {512, 2048, 4096}) Run(**gpu, 16, nv, 1, tokens);
  }
  return 0;
}
