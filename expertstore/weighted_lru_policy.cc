// Frequency-weighted LRU (Flash-MoE): score = access_count * W + last_used, lowest evicted, so an
// expert used often survives a burst of one-off experts that plain LRU would let push it out.
#include "expertstore/scored_policy.h"

namespace moe::store {
namespace {

class WeightedLruPolicy final : public ScoredPolicy {
 public:
  explicit WeightedLruPolicy(double w) : w_(w) {}
  std::string name() const override { return "weighted_lru"; }

 protected:
  double Score(const Entry& e) const override {
    return e.count * w_ + static_cast<double>(e.last_used);
  }

 private:
  const double w_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeWeightedLruPolicy(double frequency_weight) {
  return std::make_unique<WeightedLruPolicy>(frequency_weight);
}

}  // namespace moe::store
