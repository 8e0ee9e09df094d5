// CPU reference ops: known answers, thread-count independence, and the contracts in backend.h.
#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/bytes.h"

namespace moe::kernels {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(CpuBackendTest, MatMulMatchesNaiveAndIgnoresThreadCount) {
  const int64_t T = 3, N = 37, K = 53;
  auto x = Random(T * K, 1), w = Random(N * K, 2), b = Random(N, 3);
  std::vector<float> ref(T * N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = b[n];
      for (int64_t k = 0; k < K; ++k) acc += double(x[t * K + k]) * w[n * K + k];
      ref[t * N + n] = static_cast<float>(acc);
    }
  const TensorView wv = View(w.data(), DType::kF32, {N, K}), bv = View(b.data(), DType::kF32, {N});
  std::vector<float> out1(T * N), out4(T * N);
  CpuBackend(1).MatMul(out1.data(), x.data(), T, wv, &bv);
  CpuBackend(4).MatMul(out4.data(), x.data(), T, wv, &bv);
  EXPECT_EQ(out1, out4);  // bitwise: the split is over output rows only
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(out1[i], ref[i], 1e-5);
  // bf16 weights read as the bf16-rounded floats.
  std::vector<uint16_t> w16(N * K);
  std::vector<float> w16f(N * K);
  for (size_t i = 0; i < w.size(); ++i) w16f[i] = Bf16ToF32(w16[i] = F32ToBf16(w[i]));
  std::vector<float> a(T * N), c(T * N);
  CpuBackend(2).MatMul(a.data(), x.data(), T, View(w16.data(), DType::kBF16, {N, K}), nullptr);
  CpuBackend(2).MatMul(c.data(), x.data(), T, View(w16f.data(), DType::kF32, {N, K}), nullptr);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], c[i], 1e-5);
}

TEST(CpuBackendTest, RouteTopKRenormalisesAndBreaksTiesToLowerId) {
  CpuBackend cpu(1);
  const std::vector<float> logits = {0.f, 2.f, 2.f, 1.f};  // experts 1 and 2 tie
  std::vector<float> weights(2);
  std::vector<int32_t> ids(2);
  RouteArgs a{logits.data(), 1, 4, 2, true, weights.data(), ids.data()};
  cpu.Route(a);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  EXPECT_FLOAT_EQ(weights[0], 0.5f);
  a.renormalize = false;
  cpu.Route(a);
  const float denom = 1 + 2 * std::exp(2.f) + std::exp(1.f);
  EXPECT_NEAR(weights[0], std::exp(2.f) / denom, 1e-6);
}

TEST(CpuBackendTest, AttentionSlidingWindowSeesOnlyTheWindow) {
  // One head, D = 1, values = position: with window 2 the last token averages positions 3 and 4.
  CpuBackend cpu(2);
  const int64_t S = 5;
  std::vector<float> k(S, 0.f), v = {0, 1, 2, 3, 4}, q(S, 0.f), out(S);
  AttentionArgs a;
  a.out = out.data();
  a.q = q.data();
  a.k_cache = k.data();
  a.v_cache = v.data();
  a.num_tokens = S;
  a.num_heads = a.num_kv_heads = a.head_dim = 1;
  a.sliding_window = 2;
  cpu.Attention(a);
  EXPECT_FLOAT_EQ(out[4], 3.5f);
  EXPECT_FLOAT_EQ(out[0], 0.f);
  a.sliding_window = 0;
  cpu.Attention(a);
  EXPECT_FLOAT_EQ(out[4], 2.f);  // causal mean of 0..4
}

TEST(TensorTest, HalfConversionsRoundTrip) {
  for (float f : {0.f, -0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f}) {
    EXPECT_EQ(F16ToF32(F32ToF16(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(F16ToF32(F32ToF16(1e6f))));
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.00390625f)), 1.0f);  // ties to even
}

TEST(BytesTest, ParseAndFormat) {
  EXPECT_EQ(*base::ParseBytes("24GiB"), 24ull << 30);
  EXPECT_EQ(*base::ParseBytes("512 MB"), 512'000'000ull);
  EXPECT_EQ(*base::ParseBytes("0"), 0ull);
  EXPECT_FALSE(base::ParseBytes("12 parsecs").ok());
  EXPECT_FALSE(base::ParseBytes("-1GiB").ok());
  EXPECT_FALSE(base::ParseBytes("99999999999TiB").ok());
  EXPECT_EQ(base::FormatBytes(1536), "1.50 KiB");
}

}  // namespace
}  // namespace moe::kernels
