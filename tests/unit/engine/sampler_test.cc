// Sampler: greedy, seeds, truncations and penalties each change exactly what they should.
#include "engine/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace moe::engine {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, 0.5f, 2.9f, -1.0f}; }

kernels::Backend& Cpu() {
  static auto* backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {})->release();
  return *backend;
}

// One step of `s` on `logits` through the CPU backend's Sample (the reference).
kernels::SampledToken Draw(Sampler& s, std::vector<float> logits, const std::vector<int32_t>& prompt = {},
                           const std::vector<int32_t>& gen = {}, int top_logprobs = 0) {
  std::vector<kernels::PenaltyToken> penalties;
  const kernels::SampleParams row = s.Next(0, prompt, gen, top_logprobs > 0, top_logprobs, &penalties);
  kernels::SampledToken out;
  kernels::SampleArgs args;
  args.logits = logits.data();
  args.vocab_size = static_cast<int64_t>(logits.size());
  args.params = {&row, 1};
  args.penalties = penalties;
  args.out = &out;
  Cpu().Sample(args);
  return out;
}

int32_t SampleOnce(const SamplingParams& p, std::vector<float> logits,
                   const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& gen = {}) {
  Sampler s(p);
  return Draw(s, std::move(logits), prompt, gen).id;
}

TEST(SamplerTest, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SampleOnce(p, Logits()), 1);
  EXPECT_EQ(SampleOnce(p, {2.f, 5.f, 5.f, 1.f}), 1);  // ties: the lower id
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.5f;
  auto draw = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(Draw(s, Logits()).id);
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(SamplerTest, DrawsFollowTheDistribution) {
  SamplingParams p;  // temperature 1: p ~ exp(logit)
  const std::vector<float> logits = {0.f, std::log(2.f), std::log(3.f), std::log(4.f)};
  Sampler s(p);
  std::vector<int> counts(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[Draw(s, logits).id];
  for (int id = 0; id < 4; ++id) {
    const double expected = n * (id + 1) / 10.0;  // sd <= 70
    EXPECT_NEAR(counts[id], expected, 300) << "id " << id;
  }
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

// Unnormalised masses 1, 1/2, 1/4, 1/8 (total 1.875): top_p 0.6 needs 1.125, reached by the
// second; min_p 0.3 keeps the masses >= 0.3.
TEST(SamplerTest, TopPAndMinPCutWhereTheMassSays) {
  const std::vector<float> logits = {0.f, -std::log(2.f), -std::log(4.f), -std::log(8.f)};
  for (int mode = 0; mode < 2; ++mode) {
    SamplingParams p;
    (mode == 0 ? p.top_p : p.min_p) = mode == 0 ? 0.6f : 0.3f;
    std::map<int32_t, int> seen;
    for (uint64_t seed = 0; seed < 300; ++seed) {
      p.seed = seed;
      ++seen[SampleOnce(p, logits)];
    }
    EXPECT_EQ(seen.size(), 2u) << "mode " << mode;
    EXPECT_TRUE(seen.count(0) && seen.count(1)) << "mode " << mode;
  }
}

// The draw is the first candidate whose cumulative mass exceeds uniform x total.
TEST(SamplerTest, DrawBoundaryIsExact) {
  std::vector<float> logits = {1.f, 1.f, 1.f, 1.f};  // masses 1 each, total 4
  for (const auto& [uniform, want] : std::vector<std::pair<double, int32_t>>{
           {0.0, 0}, {0.2499, 0}, {0.25, 1}, {0.5, 2}, {0.7499, 2}, {0.75, 3}, {0.9999, 3}}) {
    kernels::SampleParams row;
    row.uniform = uniform;
    kernels::SampledToken out;
    kernels::SampleArgs args;
    std::vector<float> l = logits;
    args.logits = l.data();
    args.vocab_size = 4;
    args.params = {&row, 1};
    args.out = &out;
    Cpu().Sample(args);
    EXPECT_EQ(out.id, want) << "uniform " << uniform;
  }
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
  // Repetition applies once per token, however often it was seen.
  p.presence_penalty = 0.0f;
  p.repetition_penalty = 1.05f;  // 3.0 / 1.05 = 2.857 < 2.9 (twice would be 2.72: same winner)
  Sampler once(p);
  std::vector<kernels::PenaltyToken> penalties;
  once.Next(0, {1, 1, 4}, {1}, false, 0, &penalties);
  ASSERT_EQ(penalties.size(), 2u);
  EXPECT_EQ(penalties[0].id, 1);
  EXPECT_EQ(penalties[0].generated, 1);
  EXPECT_EQ(penalties[1].id, 4);
  EXPECT_EQ(penalties[1].generated, 0);
}

// Penalty tokens kept from step to step equal the ones read afresh from the whole sequence.
TEST(SamplerTest, PenaltyTokensKeptAcrossStepsEqualAFreshRead) {
  SamplingParams p;
  p.repetition_penalty = 1.2f;
  p.frequency_penalty = 0.5f;
  const std::vector<int32_t> prompt = {5, 3, 5, 9};
  std::vector<int32_t> generated;
  Sampler kept(p);
  for (int32_t next : {3, 7, 7, 5, 11, 7}) {
    generated.push_back(next);
    std::vector<kernels::PenaltyToken> a, b;
    kept.Next(0, prompt, generated, false, 0, &a);
    Sampler fresh(p);
    fresh.Next(0, prompt, generated, false, 0, &b);
    ASSERT_EQ(a.size(), b.size()) << generated.size() << " generated";
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].id, b[i].id);
      EXPECT_EQ(a[i].generated, b[i].generated) << "id " << a[i].id;
    }
  }
  // A shorter sequence than last time (not what the engine does) is read afresh.
  std::vector<kernels::PenaltyToken> again;
  kept.Next(0, prompt, {7}, false, 0, &again);
  ASSERT_EQ(again.size(), 4u);  // 5, 3, 9 from the prompt, 7 generated once
  EXPECT_EQ(again[3].id, 7);
  EXPECT_EQ(again[3].generated, 1);
}

TEST(SamplerTest, LogprobsAreNormalised) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  const kernels::SampledToken t = Draw(s, Logits(), {}, {}, 3);
  const TokenLogprobs lp = ToLogprobs(t, 3);
  EXPECT_EQ(t.id, 1);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 4);
  EXPECT_EQ(lp.top[2].first, 2);
  double total = 0;
  for (float x : Logits()) total += std::exp(x);
  EXPECT_NEAR(lp.logprob, 3.0 - std::log(total), 1e-5);
  EXPECT_NEAR(lp.top[1].second, 2.9 - std::log(total), 1e-5);
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
