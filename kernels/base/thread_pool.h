// A fixed pool of threads for the CPU backend's row-parallel loops and for I/O workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moe::base {

class ThreadPool {
 public:
  // num_threads 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread, and waits.
  // The split depends only on n and the pool size, never on timing. Runs inline when n is small
  // or when called from inside the pool (no nested parallelism, no deadlock).
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

  // Queues fn to run on some pool thread.
  void Schedule(std::function<void()> fn);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace moe::base
