// EvictionPolicy: which resident expert a full tier gives up next. A policy only orders experts;
// the tier decides which may go (slots pinned by handles or still loading may not), so a policy
// is a small class that the cache, the simulator and the tests drive the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moe::store {

// An expert of the store's model (the model is implied by the store).
struct ExpertId {
  int32_t layer = 0;
  int32_t expert = 0;
  friend bool operator==(const ExpertId&, const ExpertId&) = default;
  friend auto operator<=>(const ExpertId&, const ExpertId&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ExpertId& id) {
    return H::combine(std::move(h), id.layer, id.expert);
  }
};

// Not thread-safe: the owner (a tier, under its lock; the simulator) serialises calls.
class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string name() const = 0;
  // `id` became resident (its first use counts as an access).
  virtual void OnInsert(ExpertId id) = 0;
  // `id` was used while resident.
  virtual void OnAccess(ExpertId id) = 0;
  // `id` is no longer resident (evicted, or its load failed).
  virtual void OnErase(ExpertId id) = 0;
  // The resident expert to evict next among those for which `evictable` is true; nullopt when
  // there is none. Does not erase it (the caller calls OnErase).
  virtual std::optional<ExpertId> Victim(const std::function<bool(ExpertId)>& evictable) = 0;

  // The hooks below have defaults for the recency and frequency policies, which need none.
  // A visit of `layer` begins: `experts` is everything it uses now (one Acquire or Use call),
  // each then accessed or missed. Called before those accesses.
  virtual void BeginVisit(int32_t layer, absl::Span<const int32_t> experts) {}
  // The prefetch predictor expects the next visit of `layer` to use `experts`.
  virtual void OnPredict(int32_t layer, absl::Span<const int32_t> experts) {}
  // A miss of `incoming` found the tier full and `victim` is the policy's choice: true replaces
  // the victim, false serves `incoming` without caching it (a bypass: promoting an expert that is
  // evicted before its next use only costs transfers).
  virtual bool Admit(ExpertId incoming, ExpertId victim) { return true; }
};

struct PolicyOptions {
  // "next_use" (Belady's rule on estimated next uses, next_use_policy.cc), "lru",
  // "weighted_lru" (Flash-MoE's access_count * W + last_used), "lfu_aging". Default: "next_use".
  std::string name = "next_use";
  // The model's shape, which next_use needs (the store and the simulator set them).
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  // next_use: how fast each expert's selection statistics forget: every visit of its layer
  // weighs them by 1 - frequency_alpha (a memory of about 1 / frequency_alpha visits).
  // Default: 0.01.
  double frequency_alpha = 0.01;
  // weighted_lru: W, in units of the logical clock (one tick per access). Default: 1.
  double frequency_weight = 1.0;
  // lfu_aging: every this many accesses all counts are halved, so yesterday's favourites age
  // out. Default: 4096.
  int64_t aging_period = 4096;
  // Experts of these layers are never evicted (dflash's pinned layers); wraps the policy above.
  // Default: none.
  std::vector<int32_t> pinned_layers;
};

std::unique_ptr<EvictionPolicy> MakeNextUsePolicy(int32_t num_layers, int32_t num_experts,
                                                  double frequency_alpha);
std::unique_ptr<EvictionPolicy> MakeLruPolicy();
std::unique_ptr<EvictionPolicy> MakeWeightedLruPolicy(double frequency_weight);
std::unique_ptr<EvictionPolicy> MakeLfuAgingPolicy(int64_t aging_period);
std::unique_ptr<EvictionPolicy> MakePinnedLayersPolicy(std::unique_ptr<EvictionPolicy> inner,
                                                       std::vector<int32_t> layers);

// By options.name, wrapped in the pinned-layers decorator when pinned_layers is not empty.
// InvalidArgument names an unknown policy or a bad parameter.
absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakePolicy(const PolicyOptions& options);
// The names MakePolicy accepts.
std::vector<std::string> PolicyNames();

}  // namespace moe::store
