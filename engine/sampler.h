// Sampling parameters and each sequence's sampling state (penalty tokens, a seeded stream of
// uniform draws); the sampling itself is Backend::Sample.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/backend.h"

namespace moe::engine {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy. Default: 1
  int32_t top_k = 0;                // 0: off
  float top_p = 1.0f;               // (0, 1]; 1: off
  float min_p = 0.0f;               // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off. Divides positive logits of seen tokens
  float presence_penalty = 0.0f;    // [-2, 2]; subtracted once per generated token id
  float frequency_penalty = 0.0f;   // [-2, 2]; subtracted per occurrence in generated tokens
  uint64_t seed = 0;                // same seed, same tokens
  // InvalidArgument naming the field: NaN, negative temperature, top_p outside (0, 1], ...
  absl::Status Validate() const;
};

// The log-probability of the chosen token and the top-n alternatives, from the distribution
// after penalties and temperature (before top-k/top-p/min-p truncation).
struct TokenLogprobs {
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;
};

// One sequence's sampling state: its parameters and its seeded stream of draws. The draw itself
// runs where the logits are (Backend::Sample, whose comment gives the order and the cuts).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params) {}

  // This step's row of Backend::Sample for logits row `row`: the parameters and the next draw of
  // the stream (same seed, same draws); appends the sequence's penalty tokens to `penalties`
  // (repetition reads `prompt` and `generated`, presence/frequency `generated` only, as
  // OpenAI-style APIs define them). `top_logprobs` > 0 or `logprobs` asks for log-probabilities.
  // The penalty tokens are kept from call to call: each call reads only the tokens added since
  // the last (a sequence's prompt is fixed and its generated tokens only grow; if either is
  // shorter than last time, they are read afresh).
  kernels::SampleParams Next(int64_t row, absl::Span<const int32_t> prompt,
                             absl::Span<const int32_t> generated, bool logprobs, int top_logprobs,
                             std::vector<kernels::PenaltyToken>* penalties);

 private:
  SamplingParams params_;
  uint64_t draws_ = 0;
  std::vector<kernels::PenaltyToken> penalty_tokens_;  // each id once
  std::unordered_map<int32_t, size_t> penalty_index_;   // id -> its entry
  size_t prompt_read_ = 0, generated_read_ = 0;          // tokens already in them
};

// The host side of a SampledToken.
TokenLogprobs ToLogprobs(const kernels::SampledToken& t, int top_logprobs);

}  // namespace moe::engine
