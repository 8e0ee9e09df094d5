// StatePool: free list, owned slots, and the LRU registry of state snapshots.
#include "engine/state_pool.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {

int64_t StatePool::SlotBytes(int64_t state_bytes) {
  return (state_bytes + kStateSlotAlign - 1) / kStateSlotAlign * kStateSlotAlign;
}

absl::StatusOr<std::unique_ptr<StatePool>> StatePool::Create(kernels::Backend& backend,
                                                             int64_t state_bytes,
                                                             int64_t num_slots) {
  if (state_bytes <= 0 || num_slots <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("state pool: state_bytes ", state_bytes,
                                                   " and num_slots ", num_slots, " must be > 0"));
  }
  std::unique_ptr<StatePool> pool(new StatePool(backend, state_bytes, SlotBytes(state_bytes)));
  MOE_ASSIGN_OR_RETURN(pool->buffer_,
                       backend.Allocate(static_cast<size_t>(pool->slot_bytes_ * num_slots)));
  pool->slots_.resize(num_slots);
  for (int64_t s = num_slots - 1; s >= 0; --s) pool->free_list_.push_back(static_cast<int32_t>(s));
  pool->stats_.slot_bytes = pool->slot_bytes_;
  pool->stats_.total_slots = num_slots;
  return pool;
}

int32_t StatePool::Take(int32_t keep) {
  if (!free_list_.empty()) {
    const int32_t s = free_list_.back();
    free_list_.pop_back();
    return s;
  }
  for (int32_t s : lru_) {
    if (s == keep) continue;
    DropSnapshot(s);
    ++stats_.snapshot_evictions;
    return s;
  }
  return -1;
}

void StatePool::DropSnapshot(int32_t s) {
  Slot& slot = slots_[s];
  MOE_CHECK(slot.state == SlotState::kSnapshot) << "state slot " << s << " is no snapshot";
  registry_.erase(slot.hash);
  lru_.erase(slot.lru_it);
  slot.state = SlotState::kFree;
  slot.hash = 0;
}

int32_t StatePool::Acquire(int32_t keep) {
  const int32_t s = Take(keep);
  if (s >= 0) slots_[s].state = SlotState::kOwned;
  return s;
}

void StatePool::Release(int32_t s) {
  MOE_CHECK(s >= 0 && s < static_cast<int32_t>(slots_.size()) &&
            slots_[s].state == SlotState::kOwned)
      << "state slot " << s << " released but not owned";
  slots_[s].state = SlotState::kFree;
  free_list_.push_back(s);
}

float* StatePool::data(int32_t s) const {
  MOE_CHECK(s >= 0 && s < static_cast<int32_t>(slots_.size())) << "state slot " << s;
  return reinterpret_cast<float*>(static_cast<uint8_t*>(buffer_.data()) + s * slot_bytes_);
}

void StatePool::Zero(int32_t s) {
  MOE_CHECK(slots_[s].state == SlotState::kOwned) << "state slot " << s << " is not owned";
  backend_->Zero(data(s), static_cast<size_t>(state_bytes_));
}

void StatePool::CopyFrom(int32_t dst, int32_t snapshot) {
  MOE_CHECK(slots_[dst].state == SlotState::kOwned) << "state slot " << dst << " is not owned";
  Slot& snap = slots_[snapshot];
  MOE_CHECK(snap.state == SlotState::kSnapshot) << "state slot " << snapshot << " is no snapshot";
  backend_->CopyOnDevice(data(dst), data(snapshot), static_cast<size_t>(state_bytes_));
  lru_.splice(lru_.end(), lru_, snap.lru_it);  // most recently used
  ++stats_.snapshot_hits;
}

int32_t StatePool::FindSnapshot(uint64_t hash) const {
  auto it = registry_.find(hash);
  return it == registry_.end() ? -1 : it->second;
}

bool StatePool::TakeSnapshot(uint64_t hash, int32_t src) {
  MOE_CHECK(slots_[src].state == SlotState::kOwned) << "state slot " << src << " is not owned";
  if (registry_.contains(hash)) return false;
  const int32_t s = Take(-1);
  if (s < 0) return false;
  backend_->CopyOnDevice(data(s), data(src), static_cast<size_t>(state_bytes_));
  Slot& slot = slots_[s];
  slot.state = SlotState::kSnapshot;
  slot.hash = hash;
  slot.lru_it = lru_.insert(lru_.end(), s);
  registry_.emplace(hash, s);
  ++stats_.snapshots_taken;
  return true;
}

StatePoolStats StatePool::Stats() const {
  StatePoolStats s = stats_;
  s.free_slots = static_cast<int64_t>(free_list_.size());
  s.snapshots = static_cast<int64_t>(lru_.size());
  s.owned_slots = s.total_slots - s.free_slots - s.snapshots;
  return s;
}

std::vector<uint64_t> StatePool::SnapshotLru() const {
  std::vector<uint64_t> order;
  for (int32_t s : lru_) order.push_back(slots_[s].hash);
  return order;
}

absl::Status StatePool::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("state pool invariant: ", parts...));
  };
  std::vector<int> on_free(slots_.size(), 0), on_lru(slots_.size(), 0);
  for (int32_t s : free_list_) {
    if (++on_free[s] > 1) return broken("slot ", s, " twice on the free list");
    if (slots_[s].state != SlotState::kFree) return broken("slot ", s, " on the free list");
  }
  for (int32_t s : lru_) {
    if (++on_lru[s] > 1) return broken("slot ", s, " twice on the LRU");
    if (slots_[s].state != SlotState::kSnapshot) return broken("non-snapshot ", s, " on the LRU");
    auto it = registry_.find(slots_[s].hash);
    if (it == registry_.end() || it->second != s) return broken("snapshot ", s, " unregistered");
  }
  if (registry_.size() != lru_.size()) return broken("registry and LRU sizes differ");
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].state == SlotState::kFree && on_free[s] == 0) {
      return broken("free slot ", s, " is not on the free list");
    }
  }
  return absl::OkStatus();
}

}  // namespace moe::engine
