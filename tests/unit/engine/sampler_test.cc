// Sampler: greedy, seeds, truncations and penalties each change exactly what they should.
#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace moe::engine {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, 0.5f, 2.9f, -1.0f}; }

int32_t SampleOnce(const SamplingParams& p, std::vector<float> logits,
                   const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& gen = {}) {
  Sampler s(p);
  return s.Sample(absl::MakeSpan(logits), prompt, gen);
}

TEST(SamplerTest, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleOnce(p, Logits()), 1);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.5f;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = Logits();
      out.push_back(s.Sample(absl::MakeSpan(l), {}, {}));
    }
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, TopKOneTopPTinyAndMinPOneAreGreedy) {
  for (int mode = 0; mode < 3; ++mode) {
    SamplingParams p;
    p.temperature = 2.0f;
    if (mode == 0) p.top_k = 1;
    if (mode == 1) p.top_p = 1e-6f;
    if (mode == 2) p.min_p = 1.0f;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      p.seed = seed;
      EXPECT_EQ(SampleOnce(p, Logits()), 1) << "mode " << mode;
    }
  }
}

TEST(SamplerTest, TopKTwoOnlyDrawsTheTwoBest) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 2;
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    ++seen[SampleOnce(p, Logits())];
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(1) && seen.count(4));
}

TEST(SamplerTest, Penalties) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;  // token 1: 3.0 -> 1.5; token 4 (2.9) wins
  EXPECT_EQ(SampleOnce(p, Logits(), /*prompt=*/{1}), 4);
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.2f;    // generated once: 3.0 -> 2.8 < 2.9
  EXPECT_EQ(SampleOnce(p, Logits(), {}, /*gen=*/{1}), 4);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.04f;  // twice: 3.0 - 0.08 = 2.92 still wins; thrice: 2.88 loses
  EXPECT_EQ(SampleOnce(p, Logits(), {}, {1, 1}), 1);
  EXPECT_EQ(SampleOnce(p, Logits(), {}, {1, 1, 1}), 4);
  // Presence penalty reads generated tokens only, not the prompt.
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 2.0f;
  EXPECT_EQ(SampleOnce(p, Logits(), /*prompt=*/{1}), 1);
}

TEST(SamplerTest, LogprobsAreNormalised) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  auto l = Logits();
  TokenLogprobs lp;
  EXPECT_EQ(s.Sample(absl::MakeSpan(l), {}, {}, 3, &lp), 1);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 4);
  double total = 0;
  for (float x : Logits()) total += std::exp(x);
  EXPECT_NEAR(lp.logprob, 3.0 - std::log(total), 1e-5);
}

TEST(SamplerTest, ValidateNamesTheField) {
  SamplingParams p;
  p.temperature = std::nanf("");
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_EQ(p.Validate().code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.min_p = -0.1f;
  EXPECT_NE(p.Validate().message().find("min_p"), std::string::npos);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_NE(p.Validate().message().find("repetition_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = 3;
  EXPECT_NE(p.Validate().message().find("frequency_penalty"), std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

}  // namespace
}  // namespace moe::engine
