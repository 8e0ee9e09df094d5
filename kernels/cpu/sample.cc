// Sampling on the CPU: the reference for Backend::Sample (backend.h gives the order and the cuts).
// Candidates are sorted outright; the CUDA kernel finds the same cut points without sorting.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {
namespace {

SampledToken SampleRow(float* logits, int64_t V, const SampleParams& p,
                       absl::Span<const PenaltyToken> penalties) {
  for (const PenaltyToken& t : penalties) {
    float& l = logits[t.id];
    if (p.repetition_penalty != 1.f) {
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
    if (t.generated > 0 && (p.presence_penalty != 0.f || p.frequency_penalty != 0.f)) {
      l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(t.generated);
    }
  }
  const bool greedy = p.temperature == 0.f;
  if (!greedy) {
    for (int64_t i = 0; i < V; ++i) logits[i] /= p.temperature;
  }
  const int64_t first = std::max_element(logits, logits + V) - logits;  // ties: lower id
  const float max_logit = logits[first];
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };

  SampledToken out;
  out.id = static_cast<int32_t>(first);
  if (!greedy) {
    const int64_t keep_k = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + keep_k, order.end(), by_logit);
    std::vector<double> prob(keep_k);  // unnormalised: the first is 1
    std::vector<uint64_t> mass(keep_k);  // fixed point (backend.h): sums exact in any order
    for (int64_t i = 0; i < keep_k; ++i) {
      prob[i] = std::exp(static_cast<double>(logits[order[i]] - max_logit));
      mass[i] = static_cast<uint64_t>(std::nearbyint(prob[i] * 0x1p39));
    }
    int64_t keep = keep_k;
    if (p.top_p < 1.f) {
      const uint64_t total = std::accumulate(mass.begin(), mass.end(), uint64_t{0});
      const double target = p.top_p * static_cast<double>(total);
      uint64_t sum = 0;
      int64_t n = 0;
      while (n < keep && static_cast<double>(sum) < target) sum += mass[n++];
      keep = std::max<int64_t>(n, 1);
    }
    if (p.min_p > 0.f) {
      int64_t n = 0;
      while (n < keep && prob[n] >= p.min_p) ++n;
      keep = std::max<int64_t>(n, 1);
    }
    const uint64_t kept = std::accumulate(mass.begin(), mass.begin() + keep, uint64_t{0});
    const double target = p.uniform * static_cast<double>(kept);
    uint64_t sum = 0;
    int64_t n = 0;
    while (n + 1 < keep && static_cast<double>(sum += mass[n]) <= target) ++n;
    out.id = order[n];
  }

  if (p.logprobs || p.top_logprobs > 0) {
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
    const float log_norm = max_logit + static_cast<float>(std::log(sum));
    out.logprob = logits[out.id] - log_norm;
    const int64_t n = std::min<int64_t>(p.top_logprobs, V);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n, order.end(), by_logit);
    for (int64_t i = 0; i < n; ++i) {
      out.top_ids[i] = order[i];
      out.top_logprobs[i] = logits[order[i]] - log_norm;
    }
  }
  return out;
}

}  // namespace

void CpuBackend::Sample(const SampleArgs& a) {
  const absl::Status valid = ValidateSampleArgs(a);
  MOE_CHECK(valid.ok()) << "Sample: " << valid;
  pool_.ParallelFor(static_cast<int64_t>(a.params.size()), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const SampleParams& p = a.params[r];
      a.out[r] = SampleRow(a.logits + p.row * a.vocab_size, a.vocab_size, p,
                           a.penalties.subspan(p.penalty_begin, p.penalty_count));
    }
  });
}

}  // namespace moe::kernels
