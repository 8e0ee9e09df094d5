// MakePolicy: the one table from policy names to classes.
#include "expertstore/policy.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe::store {

std::vector<std::string> PolicyNames() { return {"lru", "weighted_lru", "lfu_aging"}; }

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(const PolicyOptions& options) {
  std::unique_ptr<EvictionPolicy> policy;
  if (options.name == "lru") {
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
