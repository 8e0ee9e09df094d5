// SlotTier: a fixed budget of memory cut into equal slots, one expert each, with an eviction
// policy. The host tier and the device tier are both a SlotTier; they differ only in where the
// memory comes from (HostAllocator vs Backend::Allocate), so the bookkeeping exists once.
//
// Not thread-safe: ExpertStore calls it under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "expertstore/policy.h"
#include "expertstore/stats.h"
#include "kernels/backend.h"

namespace moe::store {

enum class SlotState {
  kFree,
  kLoading,   // claimed; bytes arriving; `ready` not yet set
  kReady,     // resident and valid
  kDetached,  // its load failed: no longer findable, freed when the last pin goes
};

struct Slot {
  SlotState state = SlotState::kFree;
  ExpertId id;
  int32_t pins = 0;         // handles (and in-flight copies) holding it; never evicted while > 0
  bool prefetched = false;  // loaded by Prefetch and not yet acquired
  int64_t load_start_us = 0;
  std::shared_ptr<std::promise<absl::Status>> promise;
  std::shared_future<absl::Status> ready;
  std::vector<std::function<void(absl::Status)>> waiters;  // run after the load, outside the lock
};

class SlotTier {
 public:
  // `memory` holds num_slots * slot_bytes bytes; `stats` outlives the tier.
  SlotTier(std::string name, kernels::Buffer memory, uint64_t slot_bytes, int64_t num_slots,
           std::unique_ptr<EvictionPolicy> policy, TierStats* stats);

  const std::string& name() const { return name_; }
  // The slot holding (or loading) id, or -1.
  int Find(ExpertId id) const;
  // A slot for id in state kLoading with a fresh promise: a free slot, else the policy's victim
  // among ready, unpinned slots (counted as an eviction). -1 when every slot is pinned or loading,
  // or when the policy would rather not cache id (EvictionPolicy::Admit; counted as a bypass).
  int Claim(ExpertId id, int64_t now_us);
  // What the policy learns from (EvictionPolicy::BeginVisit, OnPredict).
  void BeginVisit(int32_t layer, absl::Span<const int32_t> experts) {
    policy_->BeginVisit(layer, experts);
  }
  void Predict(int32_t layer, absl::Span<const int32_t> experts) {
    policy_->OnPredict(layer, experts);
  }
  // Ends the load of `slot`: kReady on OK; on error the slot is detached (a later request loads
  // again) and freed once unpinned. Sets the promise; returns the waiters for the caller to run
  // outside its lock.
  std::vector<std::function<void(absl::Status)>> Complete(int slot, const absl::Status& status);
  void Touch(int slot) { policy_->OnAccess(slots_[slot].id); }
  void Pin(int slot) { ++slots_[slot].pins; }
  void Unpin(int slot);

  Slot& slot(int i) { return slots_[i]; }
  uint8_t* data(int i) const { return static_cast<uint8_t*>(memory_.data()) + i * slot_bytes_; }
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  int64_t pinned_slots() const;
  bool has_free_slot() const { return !free_.empty(); }
  // Counts the times a slot of `layer` became ready or was evicted: what the tier holds ready for
  // that layer changed since an earlier count when this one differs.
  uint64_t layer_changes(int32_t layer) const {
    return layer >= 0 && layer < static_cast<int32_t>(changes_.size()) ? changes_[layer] : 0;
  }

 private:
  void Free(int slot);

  const std::string name_;
  kernels::Buffer memory_;
  const uint64_t slot_bytes_;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  absl::flat_hash_map<ExpertId, int> where_;  // kLoading and kReady slots only
  std::unique_ptr<EvictionPolicy> policy_;
  TierStats* stats_;
  std::vector<uint64_t> changes_;  // per layer: layer_changes
  void Changed(int32_t layer);
};

}  // namespace moe::store
