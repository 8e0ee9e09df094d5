// StatePool: fixed-size slots of backend memory for the recurrent state of hybrid models'
// sequences (Model::state_bytes(), ForwardItem::state), and snapshots of such states keyed by the
// KV cache's chain hash of the block they end at (engine/kv_cache.h, ChainHash).
//
// Every slot is in exactly one state:
//   owned     held by a running sequence or a kept session (the engine knows which);
//   snapshot  a copy of some sequence's state after the tokens of a block chain, registered under
//             that chain's hash; reusable by a later sequence with the same prefix, evicted
//             LRU-first when an owner needs a slot;
//   free      on the free list.
// Acquire takes a free slot first and evicts the least recently used snapshot only when none is
// free, as KvCache takes a fresh block. The pool never touches a slot's bytes except in Zero,
// CopyFrom and TakeSnapshot (all queued on the backend's stream).
//
// Not thread-safe: owned by the engine loop.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace moe::engine {

struct StatePoolStats {
  int64_t slot_bytes = 0;  // one slot: the state size rounded up to kStateSlotAlign
  int64_t total_slots = 0;
  int64_t owned_slots = 0;  // running sequences and kept sessions
  int64_t snapshots = 0;    // snapshot slots (reusable, evictable)
  int64_t free_slots = 0;
  int64_t snapshots_taken = 0;     // cumulative
  int64_t snapshot_hits = 0;       // snapshots copied into a new sequence, cumulative
  int64_t snapshot_evictions = 0;  // snapshots dropped for an owner or a newer snapshot
};

// Slot stride: every slot starts at this alignment in the pool's one buffer.
inline constexpr int64_t kStateSlotAlign = 256;

class StatePool {
 public:
  // The stride of one slot holding `state_bytes` bytes.
  static int64_t SlotBytes(int64_t state_bytes);
  // One buffer of num_slots slots from `backend`. InvalidArgument for state_bytes or num_slots
  // <= 0; the backend's error (ResourceExhausted) when it cannot hold them.
  static absl::StatusOr<std::unique_ptr<StatePool>> Create(kernels::Backend& backend,
                                                           int64_t state_bytes, int64_t num_slots);

  // An owned slot: a free one, else the LRU snapshot's (evicted), never the snapshot slot `keep`
  // (-1: any). -1 when no slot can be had (every slot is owned, or `keep`).
  int32_t Acquire(int32_t keep = -1);
  // Returns an owned slot to the free list (its bytes are left as they are).
  void Release(int32_t slot);
  float* data(int32_t slot) const;
  void Zero(int32_t slot);
  // Copies snapshot `snapshot` into owned slot `dst` and marks the snapshot most recently used.
  void CopyFrom(int32_t dst, int32_t snapshot);

  // The snapshot registered under `hash`, or -1.
  int32_t FindSnapshot(uint64_t hash) const;
  // Copies owned slot `src` into a slot registered under `hash` (a free slot, else the LRU
  // snapshot's). False, with nothing changed, when `hash` is registered already or no slot is
  // free or a snapshot.
  bool TakeSnapshot(uint64_t hash, int32_t src);

  StatePoolStats Stats() const;
  int64_t state_bytes() const { return state_bytes_; }
  // Snapshot hashes, least recently used first (tests).
  std::vector<uint64_t> SnapshotLru() const;
  // Internal naming the first broken invariant (slot states, free list, registry, LRU); OK
  // otherwise. For tests.
  absl::Status CheckInvariants() const;

 private:
  enum class SlotState : uint8_t { kFree, kOwned, kSnapshot };
  struct Slot {
    SlotState state = SlotState::kFree;
    uint64_t hash = 0;                    // kSnapshot
    std::list<int32_t>::iterator lru_it;  // kSnapshot: its place in lru_
  };
  StatePool(kernels::Backend& backend, int64_t state_bytes, int64_t slot_bytes)
      : backend_(&backend), state_bytes_(state_bytes), slot_bytes_(slot_bytes) {}
  // A free slot, else the LRU snapshot (not `keep`) evicted; -1 if none. The slot is left kFree
  // and off every list: the caller sets its state.
  int32_t Take(int32_t keep);
  void DropSnapshot(int32_t slot);

  kernels::Backend* backend_;
  int64_t state_bytes_ = 0;
  int64_t slot_bytes_ = 0;
  kernels::Buffer buffer_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_list_;                   // a stack
  std::list<int32_t> lru_;                           // snapshot slots, least recently used first
  absl::flat_hash_map<uint64_t, int32_t> registry_;  // hash -> snapshot slot
  StatePoolStats stats_;
};

}  // namespace moe::engine
