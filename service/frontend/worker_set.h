// WorkerSet: the workers the frontend knows, found from a static list or a DNS name (a
// Kubernetes headless Service, re-resolved periodically), with their health and load.
// A background thread polls every worker's GetInfo; a worker is routable once a poll succeeded
// and it said it is serving, until it says it is not, `down_after_failed_polls` polls in a row
// fail (one slow poll under load is not a dead worker), or a stream fails with UNAVAILABLE
// (marked down at once); the next good poll brings it back.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "moe/internal/v1/worker.grpc.pb.h"

namespace moe::service {

// How the frontend talks to workers.
struct WorkerChannelOptions {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::string tls_server_name;  // when set, the name the workers' certificate must carry
  std::string token;            // sent as "authorization: Bearer <token>"; empty: none
  int down_after_failed_polls = 3;
};

class WorkerEndpoint {
 public:
  WorkerEndpoint(std::string target, const WorkerChannelOptions& options);

  // "host:port" as given, or "ip:port" from DNS.
  const std::string& target() const { return target_; }
  moe::internal::v1::Worker::Stub& stub() { return *stub_; }

  // Healthy and serving at the last poll, and not marked down since.
  bool up() const { return up_.load(); }
  // The worker's model as it last reported it; has_model() false until a poll succeeded.
  bool has_model() const;
  moe::v1::ModelInfo model() const;
  std::string model_name() const;

  // Routing load, kept by the frontend: tokens it expects the worker still to process for the
  // streams it sent there (prompt estimate + tokens still to generate).
  std::atomic<int64_t> outstanding_tokens{0};
  std::atomic<int64_t> streams{0};

  // Times the worker was seen with a new instance_id (restarted, its KV cache empty).
  int64_t restarts() const;
  // Adds the worker token (if any) to a call's metadata. Call before the call starts.
  void Authorize(grpc::ClientContext* context) const;

  void MarkDown(const std::string& why);
  // Records a poll's outcome. Returns true when the up/down state changed.
  bool Update(const grpc::Status& status, const moe::internal::v1::WorkerInfo& info);

 private:
  const std::string target_;
  const std::string token_;
  const int down_after_failed_polls_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<moe::internal::v1::Worker::Stub> stub_;
  std::atomic<bool> up_{false};
  mutable std::mutex mu_;
  moe::v1::ModelInfo model_;  // guarded by mu_
  bool has_model_ = false;    // guarded by mu_
  std::string instance_id_;   // guarded by mu_
  int64_t restarts_ = 0;      // guarded by mu_
  int64_t failed_polls_ = 0;  // in a row; guarded by mu_
};

struct WorkerSetOptions {
  std::vector<std::string> static_targets;  // host:port each
  std::string dns_target;                   // host:port; every address of host is a worker
  double poll_seconds = 1.0;                // GetInfo period. Default: 1
  double poll_timeout_seconds = 1.0;
  double dns_refresh_seconds = 5.0;
  WorkerChannelOptions channel;
  absl::Status Validate() const;
};

class WorkerSet {
 public:
  // Called after a poll round with the number of workers up and down (for metrics).
  using Observer = std::function<void(int64_t up, int64_t down)>;

  WorkerSet(WorkerSetOptions options, Observer observer);
  ~WorkerSet();  // stops the poll thread

  // Resolves, polls once (so a frontend started with its workers routes at once) and starts the
  // poll thread.
  void Start();
  // Stops the poll thread (no observer call after it returns). Idempotent.
  void Stop();
  // Thread-safe. The current workers (removed ones stay alive while a call holds them).
  std::vector<std::shared_ptr<WorkerEndpoint>> Snapshot() const;

 private:
  void Loop();
  void Resolve();
  void PollAll();

  const WorkerSetOptions options_;
  Observer observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, std::shared_ptr<WorkerEndpoint>> workers_;  // by target
  double next_resolve_ = 0;
  std::thread thread_;
};

}  // namespace moe::service
