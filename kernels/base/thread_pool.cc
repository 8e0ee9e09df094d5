// ThreadPool: a mutex-guarded queue; ParallelFor waits on a counter of finished chunks.
#include "kernels/base/thread_pool.h"

#include <algorithm>
#include <atomic>

namespace moe::base {
namespace {
thread_local bool t_in_pool = false;
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::WorkerLoop() {
  t_in_pool = true;
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t chunks = std::min<int64_t>(n, num_threads());
  if (chunks <= 1 || t_in_pool) {
    if (n > 0) fn(0, n);
    return;
  }
  std::mutex done_mu;
  std::condition_variable done_cv;
  int64_t remaining = chunks;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    Schedule([&, begin, end] {
      fn(begin, end);
      std::lock_guard<std::mutex> lock(done_mu);
      if (--remaining == 0) done_cv.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return remaining == 0; });
}

}  // namespace moe::base
