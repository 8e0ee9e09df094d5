// LFU with aging: evict the least frequently used (ties: least recently), and halve every count
// each aging_period accesses so that experts popular long ago do not stay forever.
#include "expertstore/scored_policy.h"

namespace moe::store {
namespace {

class LfuAgingPolicy final : public ScoredPolicy {
 public:
  explicit LfuAgingPolicy(int64_t period) : period_(period) {}
  std::string name() const override { return "lfu_aging"; }

 protected:
  double Score(const Entry& e) const override { return e.count; }
  void AfterAccess() override {
    if (clock() % period_ == 0) Rescore([](Entry& e) { e.count /= 2; });
  }

 private:
  const int64_t period_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLfuAgingPolicy(int64_t aging_period) {
  return std::make_unique<LfuAgingPolicy>(aging_period);
}

}  // namespace moe::store
