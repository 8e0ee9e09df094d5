// Pinned layers (dflash): a decorator that never offers an expert of a pinned layer as victim,
// whatever the inner policy thinks. Layers whose experts are all resident then never miss.
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "expertstore/policy.h"

namespace moe::store {
namespace {

class PinnedLayersPolicy final : public EvictionPolicy {
 public:
  PinnedLayersPolicy(std::unique_ptr<EvictionPolicy> inner, std::vector<int32_t> layers)
      : inner_(std::move(inner)), layers_(layers.begin(), layers.end()) {}
  std::string name() const override { return "pinned_layers+" + inner_->name(); }
  void OnInsert(ExpertId id) override { inner_->OnInsert(id); }
  void OnAccess(ExpertId id) override { inner_->OnAccess(id); }
  void OnErase(ExpertId id) override { inner_->OnErase(id); }
  void BeginVisit(int32_t layer, absl::Span<const int32_t> experts) override {
    inner_->BeginVisit(layer, experts);
  }
  void OnPredict(int32_t layer, absl::Span<const int32_t> experts) override {
    inner_->OnPredict(layer, experts);
  }
  bool Admit(ExpertId incoming, ExpertId victim) override {
    return inner_->Admit(incoming, victim);
  }
  std::optional<ExpertId> Victim(const std::function<bool(ExpertId)>& evictable) override {
    return inner_->Victim(
        [&](ExpertId id) { return !layers_.contains(id.layer) && evictable(id); });
  }

 private:
  std::unique_ptr<EvictionPolicy> inner_;
  absl::flat_hash_set<int32_t> layers_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakePinnedLayersPolicy(std::unique_ptr<EvictionPolicy> inner,
                                                       std::vector<int32_t> layers) {
  return std::make_unique<PinnedLayersPolicy>(std::move(inner), std::move(layers));
}

}  // namespace moe::store
