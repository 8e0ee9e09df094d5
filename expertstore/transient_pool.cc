// TransientPool: buffers allocated on first use and recycled; Take waits on a condition variable.
#include "expertstore/transient_pool.h"

#include "absl/strings/str_cat.h"
#include "kernels/base/bytes.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::store {

TransientPool::TransientPool(kernels::Backend* backend, uint64_t slot_bytes, int capacity)
    : backend_(backend), slot_bytes_(slot_bytes), capacity_(capacity) {
  MOE_CHECK(capacity >= 1) << "transient pool of " << capacity << " buffers";
  buffers_.reserve(capacity);
}

TransientPool::~TransientPool() {
  std::lock_guard<std::mutex> lock(mu_);
  MOE_CHECK(free_.size() == buffers_.size())
      << (buffers_.size() - free_.size()) << " transient buffers held at the store's end";
}

bool TransientPool::AvailableLocked(int n) const {
  return static_cast<int>(free_.size()) + (capacity_ - static_cast<int>(buffers_.size())) >= n;
}

absl::StatusOr<std::vector<int>> TransientPool::TakeLocked(int n) {
  std::vector<int> taken;
  while (static_cast<int>(taken.size()) < n && !free_.empty()) {
    taken.push_back(free_.back());
    free_.pop_back();
  }
  // At most capacity_ times in the pool's life: allocating under the lock is acceptable.
  while (static_cast<int>(taken.size()) < n) {
    absl::StatusOr<kernels::Buffer> buffer = backend_->Allocate(slot_bytes_);
    if (!buffer.ok()) {
      free_.insert(free_.end(), taken.begin(), taken.end());
      return buffer.status();
    }
    buffers_.push_back(std::move(*buffer));
    taken.push_back(static_cast<int>(buffers_.size()) - 1);
  }
  return taken;
}

absl::StatusOr<std::optional<std::vector<int>>> TransientPool::TryTake(int n) {
  MOE_CHECK(n >= 1 && n <= capacity_) << "Take(" << n << ") from a pool of " << capacity_;
  std::lock_guard<std::mutex> lock(mu_);
  if (!AvailableLocked(n)) return std::optional<std::vector<int>>();
  MOE_ASSIGN_OR_RETURN(std::vector<int> taken, TakeLocked(n));
  return std::optional<std::vector<int>>(std::move(taken));
}

absl::StatusOr<std::vector<int>> TransientPool::Take(int n, absl::Duration timeout) {
  MOE_CHECK(n >= 1 && n <= capacity_) << "Take(" << n << ") from a pool of " << capacity_;
  std::unique_lock<std::mutex> lock(mu_);
  if (!freed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                       [&] { return AvailableLocked(n); })) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "all ", capacity_, " transient buffers (", base::FormatBytes(slot_bytes_),
        " each) stayed held for ", absl::FormatDuration(timeout), " (misses that find no device",
        " slot: none free or evictable, the policy declined to cache them, or no device tier;",
        " StoreOptions::transient_buffers)"));
  }
  return TakeLocked(n);
}

void TransientPool::Release(int index) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    MOE_CHECK(index >= 0 && index < static_cast<int>(buffers_.size()))
        << "transient buffer " << index << " released but never taken";
    free_.push_back(index);
  }
  freed_.notify_all();  // waiters need different counts
}

void* TransientPool::data(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffers_[index].data();
}

int TransientPool::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(buffers_.size());
}

}  // namespace moe::store
