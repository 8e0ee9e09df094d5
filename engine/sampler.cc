// Sampling parameters, their validation, and each sequence's penalty tokens and draws.
#include "engine/sampler.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace moe::engine {

absl::Status SamplingParams::Validate() const {
  auto bad = [](const char* field, float v, const char* want) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = ", v, ": must be ", want));
  };
  if (!std::isfinite(temperature) || temperature < 0) return bad("temperature", temperature, "finite and >= 0");
  if (top_k < 0) return bad("top_k", static_cast<float>(top_k), ">= 0");
  if (!(top_p > 0 && top_p <= 1)) return bad("top_p", top_p, "in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) return bad("min_p", min_p, "in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return bad("repetition_penalty", repetition_penalty, "finite and > 0");
  }
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) return bad("presence_penalty", presence_penalty, "in [-2, 2]");
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return bad("frequency_penalty", frequency_penalty, "in [-2, 2]");
  }
  return absl::OkStatus();
}

kernels::SampleParams Sampler::Next(int64_t row, absl::Span<const int32_t> prompt,
                                    absl::Span<const int32_t> generated, bool logprobs,
                                    int top_logprobs,
                                    std::vector<kernels::PenaltyToken>* penalties) {
  const SamplingParams& p = params_;
  kernels::SampleParams out;
  out.row = row;
  out.temperature = p.temperature;
  out.top_k = p.top_k;
  out.top_p = p.top_p;
  out.min_p = p.min_p;
  out.repetition_penalty = p.repetition_penalty;
  out.presence_penalty = p.presence_penalty;
  out.frequency_penalty = p.frequency_penalty;
  out.logprobs = logprobs;
  out.top_logprobs = top_logprobs;
  // SplitMix64 of (seed, draw number): a stream that needs no state beyond the count.
  uint64_t z = p.seed + ++draws_ * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  out.uniform = static_cast<double>(z >> 11) * 0x1.0p-53;

  out.penalty_begin = static_cast<int32_t>(penalties->size());
  const bool repetition = p.repetition_penalty != 1.f;
  if (repetition || p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    if (prompt.size() < prompt_read_ || generated.size() < generated_read_) {
      penalty_tokens_.clear();
      penalty_index_.clear();
      prompt_read_ = generated_read_ = 0;
    }
    auto add = [&](int32_t id, int32_t occurrences) {
      auto [it, fresh] = penalty_index_.try_emplace(id, penalty_tokens_.size());
      if (fresh) penalty_tokens_.push_back({id, 0});
      penalty_tokens_[it->second].generated += occurrences;
    };
    if (repetition) {
      for (size_t i = prompt_read_; i < prompt.size(); ++i) add(prompt[i], 0);
      prompt_read_ = prompt.size();
    }
    for (size_t i = generated_read_; i < generated.size(); ++i) add(generated[i], 1);
    generated_read_ = generated.size();
    penalties->insert(penalties->end(), penalty_tokens_.begin(), penalty_tokens_.end());
  }
  out.penalty_count = static_cast<int32_t>(penalties->size()) - out.penalty_begin;
  return out;
}

TokenLogprobs ToLogprobs(const kernels::SampledToken& t, int top_logprobs) {
  TokenLogprobs lp;
  lp.logprob = t.logprob;
  for (int i = 0; i < top_logprobs; ++i) lp.top.emplace_back(t.top_ids[i], t.top_logprobs[i]);
  return lp;
}

}  // namespace moe::engine
