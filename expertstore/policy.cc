// MakePolicy: the one table from policy names to classes.
#include "expertstore/policy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe::store {

std::vector<std::string> PolicyNames() {
  return {"next_use", "lru", "weighted_lru", "lfu_aging"};
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(const PolicyOptions& options) {
  std::unique_ptr<EvictionPolicy> policy;
  if (options.name == "next_use") {
    if (options.num_layers <= 0 || options.num_experts <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy next_use: needs the model's shape, got ", options.num_layers,
                       " layers x ", options.num_experts, " experts"));
    }
    if (!(options.frequency_alpha > 0 && options.frequency_alpha < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy next_use: frequency_alpha ", options.frequency_alpha, " outside (0, 1)"));
    }
    policy = MakeNextUsePolicy(options.num_layers, options.num_experts, options.frequency_alpha);
  } else if (options.name == "lru") {
    policy = MakeLruPolicy();
  } else if (options.name == "weighted_lru") {
    if (!(options.frequency_weight >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy weighted_lru: frequency_weight ", options.frequency_weight, " < 0"));
    }
    policy = MakeWeightedLruPolicy(options.frequency_weight);
  } else if (options.name == "lfu_aging") {
    if (options.aging_period <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("policy lfu_aging: aging_period ", options.aging_period, " <= 0"));
    }
    policy = MakeLfuAgingPolicy(options.aging_period);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction policy '", options.name, "' is not one of ", absl::StrJoin(PolicyNames(), ", ")));
  }
  if (!options.pinned_layers.empty()) {
    policy = MakePinnedLayersPolicy(std::move(policy), options.pinned_layers);
  }
  return policy;
}

}  // namespace moe::store
