// Readiness: whether the worker can serve, and why not when it cannot. It goes NOT_SERVING for
// good when the drain starts, or when `max_consecutive_faults` requests in a row end with a
// fault of the worker itself (DATA_LOSS, INTERNAL, UNKNOWN: a corrupt or unreadable expert
// store, a backend error) and none succeeds between them. Such a worker would fail every request
// routed to it, so it stops passing readiness and the frontend routes elsewhere; it does not
// come back by itself (a corrupt blob does not heal), the reason says what to fix. Client
// errors (INVALID_ARGUMENT, ...) and cancellations say nothing about the worker and count
// neither way.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "absl/status/status.h"

namespace moe::service {

class Readiness {
 public:
  // Called (outside the lock, at most once per change) when serving turns false.
  using Listener = std::function<void(const std::string& reason)>;

  explicit Readiness(int max_consecutive_faults) : max_faults_(max_consecutive_faults) {}

  // Thread-safe. Set once, before requests arrive.
  void SetListener(Listener listener);
  // Thread-safe. A request finished: `status` is its error, OK for a completion.
  void RequestEnded(const absl::Status& status);
  // Thread-safe. The drain started.
  void StartDrain();

  // Thread-safe.
  bool serving() const;
  std::string reason() const;  // empty while serving

  // Whether a request's error is the worker's fault rather than the request's.
  static bool IsWorkerFault(absl::StatusCode code);

 private:
  void StopServing(std::string reason);

  const int max_faults_;
  mutable std::mutex mu_;
  Listener listener_;       // guarded by mu_
  bool serving_ = true;     // guarded by mu_
  std::string reason_;      // guarded by mu_
  int consecutive_faults_ = 0;  // guarded by mu_
};

}  // namespace moe::service
