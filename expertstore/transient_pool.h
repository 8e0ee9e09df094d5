// TransientPool: a fixed number of equal backend buffers for loads that find no device slot.
//
// ExpertStore gives a handle one of these when the device tier is absent or every device slot is
// pinned. Each buffer is allocated the first time it is needed and kept until the pool goes, so
// once warm a miss never allocates backend memory (a cudaMalloc per miss under the store's lock
// stalled every stream). When fewer than a caller needs are free, Take waits for Releases.
//
// Thread-safety: thread-safe. Its lock is a leaf: Take and Release may be called with the
// store's lock held, but Take with a timeout should not be (it would block the loads whose
// handles free the buffers; ExpertStore unlocks around it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/backend.h"

namespace moe::store {

class TransientPool {
 public:
  // capacity >= 1 buffers of slot_bytes each from `backend`, which must outlive the pool.
  TransientPool(kernels::Backend* backend, uint64_t slot_bytes, int capacity);
  // Aborts if a buffer is still held (its handle outlived the store: a programmer error).
  ~TransientPool();

  // `n` (1 <= n <= capacity) free buffers' indices, taken together: released ones first, then
  // new ones while fewer than capacity exist. All or nothing, so that two callers that each need
  // several never hold part of them while waiting for the rest.
  // TryTake: no value when fewer than n are free now. The backend's error when allocating fails.
  absl::StatusOr<std::optional<std::vector<int>>> TryTake(int n);
  // Take: waits up to `timeout` for Releases to free n. ResourceExhausted when they stay held
  // (the message names the capacity and the wait); the backend's error when allocating fails.
  absl::StatusOr<std::vector<int>> Take(int n, absl::Duration timeout);
  // Returns buffer `index` (from Take) to the pool and wakes the waiters.
  void Release(int index);

  void* data(int index) const;  // valid from Take until Release
  int capacity() const { return capacity_; }
  int allocated() const;  // buffers allocated so far, <= capacity

 private:
  kernels::Backend* const backend_;
  const uint64_t slot_bytes_;
  const int capacity_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  std::vector<kernels::Buffer> buffers_;  // guarded by mu_; grows to capacity_, never shrinks
  std::vector<int> free_;                 // guarded by mu_

  bool AvailableLocked(int n) const;
  absl::StatusOr<std::vector<int>> TakeLocked(int n);
};

}  // namespace moe::store
