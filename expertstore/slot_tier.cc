// SlotTier bookkeeping. Invariant: an id is in where_ iff its slot is kLoading or kReady, and
// then the policy knows it; free_ holds exactly the kFree slots.
#include "expertstore/slot_tier.h"

#include "kernels/base/check.h"

namespace moe::store {

SlotTier::SlotTier(std::string name, kernels::Buffer memory, uint64_t slot_bytes, int64_t num_slots,
                   std::unique_ptr<EvictionPolicy> policy, TierStats* stats)
    : name_(std::move(name)),
      memory_(std::move(memory)),
      slot_bytes_(slot_bytes),
      slots_(num_slots),
      policy_(std::move(policy)),
      stats_(stats) {
  for (int i = static_cast<int>(num_slots) - 1; i >= 0; --i) free_.push_back(i);
  stats_->slots = num_slots;
  stats_->slot_bytes = slot_bytes;
}

int SlotTier::Find(ExpertId id) const {
  auto it = where_.find(id);
  return it == where_.end() ? -1 : it->second;
}

int SlotTier::Claim(ExpertId id, int64_t now_us) {
  MOE_CHECK(Find(id) < 0) << name_ << ": claiming layer " << id.layer << " expert " << id.expert
                          << " twice";
  int s = -1;
  // A free slot costs nothing, so the policy is asked only when the tier is full; Admit only
  // then too, since declining to cache (a bypass) is worth it only when caching would evict.
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else {
    // Only ready, unpinned slots may go: a loading slot's bytes are awaited by handles or
    // waiters, and a pinned one is being read.
    std::optional<ExpertId> victim = policy_->Victim([this](ExpertId v) {
      const Slot& slot = slots_[where_.at(v)];
      return slot.state == SlotState::kReady && slot.pins == 0;
    });
    if (!victim) return -1;
    if (!policy_->Admit(id, *victim)) {
      ++stats_->bypasses;
      return -1;
    }
    s = where_.at(*victim);
    Changed(victim->layer);
    where_.erase(*victim);
    policy_->OnErase(*victim);
    ++stats_->evictions;
  }
  Slot& slot = slots_[s];
  slot = Slot{};
  slot.state = SlotState::kLoading;
  slot.id = id;
  slot.load_start_us = now_us;
  slot.promise = std::make_shared<std::promise<absl::Status>>();
  slot.ready = slot.promise->get_future().share();
  where_[id] = s;
  policy_->OnInsert(id);
  return s;
}

std::vector<std::function<void(absl::Status)>> SlotTier::Complete(int s,
                                                                  const absl::Status& status) {
  Slot& slot = slots_[s];
  MOE_CHECK(slot.state == SlotState::kLoading) << name_ << ": slot " << s << " completed twice";
  // The layer's version moves when an expert becomes readable (here) or stops being so
  // (eviction), not when a load starts: PinReadable hands out only kReady slots.
  if (status.ok()) {
    slot.state = SlotState::kReady;
    Changed(slot.id.layer);
  } else {
    // Detached, not freed: handles may still hold the slot, and a new load must not write into
    // memory they point at; it is freed when the last pin goes.
    slot.state = SlotState::kDetached;
    where_.erase(slot.id);
    policy_->OnErase(slot.id);
  }
  slot.promise->set_value(status);
  std::vector<std::function<void(absl::Status)>> waiters = std::move(slot.waiters);
  slot.waiters.clear();
  if (slot.state == SlotState::kDetached && slot.pins == 0) Free(s);
  return waiters;
}

void SlotTier::Unpin(int s) {
  Slot& slot = slots_[s];
  MOE_CHECK(slot.pins > 0) << name_ << ": slot " << s << " released more often than acquired";
  if (--slot.pins == 0 && slot.state == SlotState::kDetached) Free(s);
}

void SlotTier::Free(int s) {
  slots_[s] = Slot{};
  free_.push_back(s);
}

void SlotTier::Changed(int32_t layer) {
  if (layer >= static_cast<int32_t>(changes_.size())) changes_.resize(layer + 1);
  ++changes_[layer];
}

int64_t SlotTier::pinned_slots() const {
  int64_t n = 0;
  for (const Slot& s : slots_) n += s.pins > 0;
  return n;
}

}  // namespace moe::store
