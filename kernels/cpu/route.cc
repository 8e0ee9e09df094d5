// Router on the CPU: softmax or sigmoid scores, top-k of score + selection bias with ties to the
// lower id, the unbiased scores as weights, optional renormalise, scaling (backend.h RouteArgs).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/cpu_backend.h"

namespace moe::kernels {

void CpuBackend::Route(const RouteArgs& a) {
  MOE_CHECK(a.top_k > 0 && a.top_k <= a.num_experts)
      << "Route: top_k " << a.top_k << " of " << a.num_experts;
  const int E = a.num_experts, K = a.top_k;
  std::vector<float> probs(E), keys(E);
  std::vector<int> order(E);
  for (int64_t t = 0; t < a.num_tokens; ++t) {
    const float* logits = a.logits + t * E;
    if (!std::all_of(logits, logits + E, [](float x) { return std::isfinite(x); })) {
      for (int k = 0; k < K; ++k) {  // experts 0..K-1, weight 0: nothing of them is added
        a.expert_ids[t * K + k] = k;
        a.weights[t * K + k] = 0.f;
      }
      NoteRoutingFault(a.layer, kNonFiniteLogits);
      continue;
    }
    if (a.scoring == RouteScoring::kSigmoid) {
      for (int e = 0; e < E; ++e) probs[e] = 1.f / (1.f + std::exp(-logits[e]));
    } else {
      const float max_logit = *std::max_element(logits, logits + E);
      float sum = 0.f;
      for (int e = 0; e < E; ++e) sum += probs[e] = std::exp(logits[e] - max_logit);
      for (int e = 0; e < E; ++e) probs[e] /= sum;
    }
    for (int e = 0; e < E; ++e) {
      keys[e] = a.selection_bias != nullptr ? probs[e] + a.selection_bias[e] : probs[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int x, int y) {
      return keys[x] > keys[y] || (keys[x] == keys[y] && x < y);
    });
    float top_sum = 0.f;
    for (int k = 0; k < K; ++k) top_sum += probs[order[k]];
    for (int k = 0; k < K; ++k) {
      const float w = probs[order[k]];
      a.expert_ids[t * K + k] = order[k];
      a.weights[t * K + k] = (a.renormalize ? w / (top_sum + a.renormalize_eps) : w) * a.scaling;
    }
  }
}

}  // namespace moe::kernels
