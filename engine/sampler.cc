// Sampler: the order is penalties -> temperature -> top-k -> top-p -> min-p -> draw.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

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

int32_t Sampler::Sample(absl::Span<float> logits, absl::Span<const int32_t> prompt,
                        absl::Span<const int32_t> generated, int top_logprobs,
                        TokenLogprobs* logprobs) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const SamplingParams& p = params_;
  if (p.repetition_penalty != 1.0f) {
    // transformers' RepetitionPenaltyLogitsProcessor: each seen token once.
    std::vector<bool> seen(V, false);
    for (auto ids : {prompt, generated}) {
      for (int32_t id : ids) {
        if (id < 0 || id >= V || seen[id]) continue;
        seen[id] = true;
        float& l = logits[id];
        l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
      }
    }
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : generated) ++counts[id];
    for (const auto& [id, n] : counts) {
      if (id >= 0 && id < V) logits[id] -= p.presence_penalty + p.frequency_penalty * n;
    }
  }
  const bool greedy = p.temperature == 0.0f;
  if (!greedy) {
    for (float& l : logits) l /= p.temperature;
  }

  // Log-softmax of the (penalised, tempered) distribution for logprobs and for sampling.
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - max_logit));
  const float log_norm = max_logit + static_cast<float>(std::log(sum));

  int32_t chosen;
  if (greedy) {
    chosen = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // Candidates in descending probability, ties to the lower id (deterministic).
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    int64_t keep = V;
    if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (keep < V) {
      std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
    } else {
      std::sort(order.begin(), order.end(), by_logit);
    }
    order.resize(keep);
    std::vector<double> probs(keep);
    for (int64_t i = 0; i < keep; ++i) probs[i] = std::exp(static_cast<double>(logits[order[i]] - log_norm));
    if (p.top_p < 1.0f) {
      // Smallest prefix whose mass (renormalised over the top-k survivors) reaches top_p.
      const double total = std::accumulate(probs.begin(), probs.end(), 0.0);
      double mass = 0;
      int64_t n = 0;
      while (n < keep && mass < p.top_p * total) mass += probs[n++];
      keep = std::max<int64_t>(n, 1);
    }
    if (p.min_p > 0.0f) {
      const double threshold = p.min_p * probs[0];
      int64_t n = 0;
      while (n < keep && probs[n] >= threshold) ++n;
      keep = std::max<int64_t>(n, 1);
    }
    std::discrete_distribution<int64_t> draw(probs.begin(), probs.begin() + keep);
    chosen = order[draw(rng_)];
  }

  if (logprobs != nullptr) {
    logprobs->logprob = logits[chosen] - log_norm;
    logprobs->top.clear();
    if (top_logprobs > 0) {
      std::vector<int32_t> order(V);
      std::iota(order.begin(), order.end(), 0);
      const int64_t n = std::min<int64_t>(top_logprobs, V);
      std::partial_sort(order.begin(), order.begin() + n, order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
      for (int64_t i = 0; i < n; ++i) logprobs->top.emplace_back(order[i], logits[order[i]] - log_norm);
    }
  }
  return chosen;
}

}  // namespace moe::engine
