// Router: picks the worker for a request. Order of preference: the worker that holds the
// request's session (its KV is kept there), then the least loaded by outstanding tokens.
#pragma once

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "service/frontend/worker_set.h"
#include "service/proto_convert.h"

namespace moe::service {

class Router {
 public:
  // `max_sessions`: session -> worker entries remembered (least recently used forgotten first).
  Router(WorkerSet& workers, size_t max_sessions = 100000);

  // NotFound: no known worker serves `model` (the message lists the models that are served).
  // Unavailable: workers serve it but none is up (or all are in `exclude`, the targets this
  // request already failed on).
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> Pick(const std::string& model,
                                                       const std::string& session_id,
                                                       const std::set<std::string>& exclude);
  // The limits validation needs, from any worker that reported `model`. NotFound as above;
  // Unavailable when no worker has reported at all yet.
  absl::StatusOr<ModelLimits> Limits(const std::string& model) const;
  // Remembers that `session_id` now lives on `target`.
  void Bind(const std::string& session_id, const std::string& target);
  // The worker `session_id` was bound to, if any is still known; and forgetting it.
  std::shared_ptr<WorkerEndpoint> SessionWorker(const std::string& session_id);
  void Unbind(const std::string& session_id);

 private:
  absl::Status UnknownModel(const std::string& model) const;

  WorkerSet& workers_;
  const size_t max_sessions_;
  std::atomic<uint64_t> rotation_{0};
  std::mutex mu_;
  std::list<std::string> lru_;  // session ids, most recent first
  std::map<std::string, std::pair<std::string, std::list<std::string>::iterator>> sessions_;
};

}  // namespace moe::service
