// Admission: a bounded queue in front of the workers. At most max_running calls are relayed at
// once; up to max_queued more wait in arrival order; beyond that, calls are refused at once.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "absl/status/statusor.h"

namespace moe::service {

struct AdmissionOptions {
  int64_t max_running = 256;  // calls relayed to workers at once. Default: 256
  int64_t max_queued = 1024;  // calls waiting for a slot. Default: 1024
  absl::Status Validate() const;
};

class Admission {
 public:
  using Start = std::function<void()>;
  // Called with the counts whenever they change (for metrics).
  using Observer = std::function<void(int64_t running, int64_t queued)>;

  Admission(AdmissionOptions options, Observer observer);

  // Runs `start` now, on this thread, if a slot is free; else queues it to run on the thread
  // that frees a slot. Returns a ticket for Withdraw. ResourceExhausted when the queue is full;
  // Unavailable after Close.
  absl::StatusOr<uint64_t> Enter(Start start);
  // Frees the slot of a started call and starts the oldest queued one.
  void Leave();
  // Takes a queued call out (its client went away). False if it already started (then it
  // holds a slot and must Leave).
  bool Withdraw(uint64_t ticket);
  // Refuses every later Enter (draining).
  void Close();

  int64_t running() const;
  int64_t queued() const;

 private:
  void Notify(int64_t running, int64_t queued);

  const AdmissionOptions options_;
  Observer observer_;
  mutable std::mutex mu_;
  struct Waiter {
    uint64_t ticket;
    Start start;
  };
  std::deque<Waiter> queue_;
  int64_t running_ = 0;
  uint64_t next_ticket_ = 1;
  bool closed_ = false;
};

}  // namespace moe::service
