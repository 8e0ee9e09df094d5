// Sampling: penalties, temperature, top-k, top-p, min-p, and a seeded draw; greedy at
// temperature 0. Runs on host logits of one sequence.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // Picks the next token. `logits` [V] is modified in place. `prompt` and `generated` are the
  // sequence so far (repetition penalty reads both; presence/frequency read `generated` only,
  // as OpenAI-style APIs define them). `top_logprobs` > 0 fills `logprobs`.
  int32_t Sample(absl::Span<float> logits, absl::Span<const int32_t> prompt,
                 absl::Span<const int32_t> generated, int top_logprobs = 0,
                 TokenLogprobs* logprobs = nullptr);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace moe::engine
