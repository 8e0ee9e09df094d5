// CheckpointExpertProvider: every handle is ready at once.
#include "expertstore/checkpoint_provider.h"

#include "absl/strings/str_cat.h"

namespace moe::store {

CheckpointExpertProvider::CheckpointExpertProvider(
    std::vector<std::vector<kernels::ExpertWeights>> experts) {
  for (auto& layer : experts) {
    auto& out = experts_.emplace_back();
    for (auto& w : layer) out.push_back(std::make_shared<const kernels::ExpertWeights>(w));
  }
  std::promise<absl::Status> done;
  done.set_value(absl::OkStatus());
  ready_ = done.get_future().share();
}

absl::StatusOr<std::vector<ExpertHandle>> CheckpointExpertProvider::Acquire(
    int32_t layer, absl::Span<const int32_t> experts) {
  if (layer < 0 || layer >= static_cast<int32_t>(experts_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  const auto& table = experts_[layer];
  std::vector<ExpertHandle> handles;
  handles.reserve(experts.size());
  for (int32_t e : experts) {
    if (e < 0 || e >= static_cast<int32_t>(table.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " has no expert ", e, " (", table.size(), " experts)"));
    }
    handles.push_back(ExpertHandle{layer, e, ready_, table[e]});
  }
  return handles;
}

std::vector<kernels::ExpertWeights> CheckpointExpertProvider::ResidentLayer(int32_t layer) const {
  std::vector<kernels::ExpertWeights> views;
  if (layer < 0 || layer >= static_cast<int32_t>(experts_.size())) return views;
  for (const auto& w : experts_[layer]) views.push_back(*w);
  return views;
}

}  // namespace moe::store
