// T7 of the TurboQuant spec: attention-output error and attention-probability KL against the bf16
// cache must improve monotonically with bits, on random and on real (model) Q/K/V. T8 with the
// 16-bit KV tail: it lowers the next-token KL, to ~0 when it covers every position.
#include <algorithm>
#include <random>
#include <string>

#include "engine/default_model.h"
#include "gtest/gtest.h"
#include "tests/bench/kv_quality_lib.h"
#include "tests/testing/temp_dir.h"

namespace moe::bench {
namespace {

using kernels::KvFormat;

void ExpectMonotone(const std::vector<KvFormat>& fewer_to_more_bits, const float* q, const float* k,
                    const float* v, int64_t T, int nh, int nkv, int d, int layer) {
  double prev_err = 1e9, prev_kl = 1e9;
  for (KvFormat f : fewer_to_more_bits) {
    auto r = MeasureAttention(f, q, k, v, T, nh, nkv, d, layer);
    ASSERT_TRUE(r.ok()) << r.status();
    std::printf("D=%d layer %d %-8s rel L2 %.4f KL %.3e\n", d, layer, kernels::KvFormatName(f),
                r->rel_l2, r->kl);
    EXPECT_LT(r->rel_l2, prev_err) << kernels::KvFormatName(f);
    EXPECT_LT(r->kl, prev_kl) << kernels::KvFormatName(f);
    prev_err = r->rel_l2;
    prev_kl = r->kl;
  }
}

TEST(KvQualityTest, RandomQkvImprovesWithBits) {
  const int T = 128, NH = 4, NKV = 2, D = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> q(T * NH * D), k(T * NKV * D), v(T * NKV * D);
  for (float& x : q) x = g(rng);
  for (float& x : k) x = g(rng);
  for (float& x : v) x = g(rng);
  ExpectMonotone({KvFormat::kTq2, KvFormat::kTq2p5, KvFormat::kTq3, KvFormat::kTq3p5,
                  KvFormat::kTq4, KvFormat::kFp8E4m3},
                 q.data(), k.data(), v.data(), T, NH, NKV, D, 0);
}

// Every layer of the model in `dir`, on the Q/K/V of a 96-token prefill of random tokens.
void ExpectModelMonotone(const std::string& dir, const std::vector<KvFormat>& fewer_to_more_bits) {
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  ASSERT_TRUE(backend.ok());
  auto model = engine::Model::Load(dir, **backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const engine::ModelConfig& c = (*model)->config();
  std::vector<int32_t> tokens(96);
  std::mt19937 rng(5);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % std::min<int64_t>(600, c.vocab_size));
  auto qkv = CaptureQkv(**model, tokens);
  ASSERT_TRUE(qkv.ok()) << qkv.status();
  for (size_t l = 0; l < qkv->size(); ++l) {
    const LayerQkv& x = (*qkv)[l];
    ExpectMonotone(fewer_to_more_bits, x.q.data(), x.k.data(), x.v.data(), x.T,
                   static_cast<int>(c.num_attention_heads), static_cast<int>(c.num_key_value_heads),
                   static_cast<int>(c.head_dim), static_cast<int>(l));
  }
}

TEST(KvQualityTest, ModelQkvImprovesWithBits) {
  testing::TempDir dir;
  ASSERT_TRUE(engine::WriteDefaultModel(dir.path()).ok());
  ExpectModelMonotone(dir.path(), {KvFormat::kTq2, KvFormat::kTq3, KvFormat::kTq4,
                                   KvFormat::kFp8E4m3});
}

// The golden fixtures: tiny checkpoints written by transformers (four architectures, head_dim 24
// and 16).
TEST(KvQualityTest, GoldenFixturesQkvImproveWithBits) {
  for (const char* arch : {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe"}) {
    SCOPED_TRACE(arch);
    ExpectModelMonotone(std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/" + arch,
                        {KvFormat::kTq2, KvFormat::kTq3, KvFormat::kTq4, KvFormat::kFp8E4m3});
  }
}

// T8 with the 16-bit KV tail (--kv_tail_tokens): a tail that covers every position reads the
// whole cache in bf16, so the next-token distributions are the bf16 cache's (KL ~0, the same
// argmax); a shorter one lowers the KL of every compressed format on the default model.
TEST(KvQualityTest, TailLowersNextTokenKl) {
  testing::TempDir dir;
  ASSERT_TRUE(engine::WriteDefaultModel(dir.path()).ok());
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  ASSERT_TRUE(backend.ok());
  auto model = engine::Model::Load(dir.path(), **backend);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int32_t> prompt(24);
  std::mt19937 rng(5);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % 600);
  const int steps = 40;
  for (KvFormat f : {KvFormat::kFp8E4m3, KvFormat::kTq4, KvFormat::kTq2}) {
    auto none = MeasureNextToken(**model, f, prompt, steps);
    auto some = MeasureNextToken(**model, f, prompt, steps, 16);
    auto all = MeasureNextToken(**model, f, prompt, steps, 128);  // > 24 + 40 positions
    ASSERT_TRUE(none.ok() && some.ok() && all.ok());
    std::printf("%-8s T8 KL mean: no tail %.3e, tail 16 %.3e, tail 128 %.3e\n",
                kernels::KvFormatName(f), none->mean_kl, some->mean_kl, all->mean_kl);
    EXPECT_GT(none->mean_kl, 0) << kernels::KvFormatName(f);
    EXPECT_LT(some->mean_kl, none->mean_kl) << kernels::KvFormatName(f);
    EXPECT_LT(all->max_kl, 1e-6) << kernels::KvFormatName(f);
    EXPECT_EQ(all->agreement, 1.0) << kernels::KvFormatName(f);
  }
}

}  // namespace
}  // namespace moe::bench
