// GatedDeltaRule and CausalConv on the GPU at Qwen3-Next's shapes (NK 16, NV 32, DK = DV 128,
// conv width 4 over 2 NK DK + NV DV = 8192 channels): time per call, and for decode the state
// bandwidth (S read and written once: 2 NV DK DV 4 bytes a sequence) against the HBM ceiling.
// Usage: gdn_bench (no flags; a CUDA device).
#include <chrono>
#include <cstdio>
#include <vector>

#include "kernels/backend.h"

namespace {

using moe::kernels::Backend;
using moe::kernels::Buffer;
using moe::kernels::DType;

constexpr int NK = 16, NV = 32, DK = 128, DV = 128, KW = 4;
constexpr int64_t C = 2 * NK * DK + NV * DV;

Buffer Zeroed(Backend& gpu, size_t bytes) {
  Buffer b = gpu.Allocate(bytes).value();
  gpu.Zero(b.data(), bytes);
  return b;
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

void Run(Backend& gpu, int num_seqs, int64_t tokens_per_seq) {
  const int64_t T = num_seqs * tokens_per_seq;
  Buffer qkv = Zeroed(gpu, T * C * 4), conv_out = Zeroed(gpu, T * C * 4);
  Buffer b = Zeroed(gpu, T * NV * 4), a = Zeroed(gpu, T * NV * 4),
         out = Zeroed(gpu, T * NV * DV * 4);
  Buffer states = Zeroed(gpu, size_t{4} * num_seqs * NV * DK * DV);
  Buffer conv_states = Zeroed(gpu, size_t{4} * num_seqs * C * (KW - 1));
  std::vector<float> ones(NV, 0.5f), conv_w(C * KW, 0.25f);
  const moe::kernels::TensorView head_view = moe::kernels::View(ones.data(), DType::kF32, {NV});
  auto a_log = gpu.Upload(head_view).value();
  auto w = gpu.Upload(moe::kernels::View(conv_w.data(), DType::kF32, {C, 1, KW})).value();
  std::vector<moe::kernels::LinearAttnSeq> seqs(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    seqs[s].num_tokens = tokens_per_seq;
    seqs[s].state = static_cast<float*>(states.data()) + int64_t{s} * NV * DK * DV;
    seqs[s].conv_state = static_cast<float*>(conv_states.data()) + s * C * (KW - 1);
  }
  moe::kernels::GatedDeltaRuleArgs g;
  g.out = static_cast<float*>(out.data());
  g.qkv = static_cast<const float*>(qkv.data());
  g.b = static_cast<const float*>(b.data());
  g.a = static_cast<const float*>(a.data());
  g.a_log = a_log.view;
  g.dt_bias = a_log.view;
  g.num_k_heads = NK;
  g.num_v_heads = NV;
  g.k_head_dim = DK;
  g.v_head_dim = DV;
  g.seqs = seqs;
  moe::kernels::CausalConvArgs c;
  c.out = static_cast<float*>(conv_out.data());
  c.x = static_cast<const float*>(qkv.data());
  c.weight = w.view;
  c.channels = C;
  c.kernel_size = KW;
  c.seqs = seqs;
  const int reps = T > 1024 ? 5 : 50;
  const double rule_us = Time(gpu, reps, [&] { gpu.GatedDeltaRule(g); });
  const double conv_us = Time(gpu, reps, [&] { gpu.CausalConv(c); });
  const double state_gb = 2.0 * num_seqs * NV * DK * DV * 4 / 1e9;
  std::printf(
      "seqs %3d x %5lld tokens: GatedDeltaRule %9.1f us (%6.1f ns/token/seq; state %6.0f GB/s)"
      "  CausalConv %8.1f us\n",
      num_seqs, static_cast<long long>(tokens_per_seq), rule_us,
      rule_us * 1e3 / static_cast<double>(tokens_per_seq), state_gb / (rule_us * 1e-6), conv_us);
}

}  // namespace

int main() {
  auto gpu = moe::kernels::MakeBackend(moe::kernels::BackendKind::kCuda, {});
  if (!gpu.ok()) {
    std::fprintf(stderr, "gdn_bench: %s\n", gpu.status().ToString().c_str());
    return 2;
  }
  std::printf("GatedDeltaNet NK %d NV %d DK %d DV %d KW %d (H100 HBM3 ~3350 GB/s, H200 ~4800)\n",
              NK, NV, DK, DV, KW);
  for (int seqs : {1, 8, 64, 256}) Run(**gpu, seqs, 1);
  for (int64_t tokens : {64, 512, 4096}) Run(**gpu, 1, tokens);
  Run(**gpu, 8, 512);
  return 0;
}
