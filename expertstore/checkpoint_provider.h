// The trivial ExpertProvider: experts are read straight from a mapped checkpoint (every expert is
// always "resident"). The tiered store replaces it; the forward pass cannot tell them apart.
#pragma once

#include <vector>

#include "expertstore/expert_provider.h"

namespace moe::store {

class CheckpointExpertProvider final : public ExpertProvider {
 public:
  // experts[layer][expert]: backend-readable views; layers without experts are empty vectors.
  // The views must outlive the provider.
  explicit CheckpointExpertProvider(std::vector<std::vector<kernels::ExpertWeights>> experts);

  absl::StatusOr<std::vector<ExpertHandle>> Acquire(int32_t layer,
                                                    absl::Span<const int32_t> experts) override;
  std::vector<kernels::ExpertWeights> ResidentLayer(int32_t layer) const override;

 private:
  std::vector<std::vector<std::shared_ptr<const kernels::ExpertWeights>>> experts_;
  std::shared_future<absl::Status> ready_;
};

}  // namespace moe::store
