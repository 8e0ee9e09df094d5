// GenerateStream: the server-streaming reactor of one Worker.Generate call. It is the request's
// StreamSink: the engine thread pushes events, and the reactor writes them out one message at a
// time, folding events that arrived during a write into the next message.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "moe/internal/v1/worker.grpc.pb.h"
#include "service/metrics/worker_metrics.h"
#include "service/worker/engine_loop.h"
#include "service/worker/readiness.h"

namespace moe::service {

class GenerateStream final
    : public grpc::ServerWriteReactor<moe::internal::v1::WorkerGenerateResponse>,
      public StreamSink,
      public std::enable_shared_from_this<GenerateStream> {
 public:
  struct Context {
    std::string client_request_id;  // echoed in responses
    std::string engine_id;          // the id the engine knows it by
    std::string worker_name;
    double frontend_queue_seconds = 0;
    double frontend_elapsed_seconds = 0;
    bool logprobs = false;  // the request asked for logprobs
    Readiness* readiness = nullptr;  // told how the request ended; may be null
    // The call's deadline: a cancellation after it counts as outcome "deadline_exceeded".
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max();
  };

  // Makes a stream that owns itself until gRPC calls OnDone (the engine loop may hold it longer).
  static std::shared_ptr<GenerateStream> Create(Context context, EngineLoop& loop,
                                                metrics::WorkerMetrics& metrics);
  // Ends the call with `status` before any engine work (validation, draining).
  void Reject(const grpc::Status& status);
  // Sets prompt_opens_thinking on the first response; call before the engine sees the request.
  void SetPromptOpensThinking();

  void OnEvent(engine::Event event) override;  // engine thread

 private:
  GenerateStream(Context context, EngineLoop& loop, metrics::WorkerMetrics& metrics);
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // Starts the next write, or Finish, if nothing is in flight. Never holds mu_ while calling
  // into gRPC (a reaction may run inline and take mu_ again).
  void Pump();
  void Fill(moe::v1::GenerateResponse* out);  // requires mu_

  const Context ctx_;
  EngineLoop& loop_;
  metrics::WorkerMetrics& metrics_;
  std::shared_ptr<GenerateStream> self_;  // released in OnDone
  const double start_ = 0;

  std::mutex mu_;
  std::vector<engine::Event> pending_;        // events not yet written
  std::optional<grpc::Status> final_status_;  // set by the final event
  bool writing_ = false, finish_called_ = false, cancelled_ = false;
  bool deadline_exceeded_ = false;  // OnCancel came at or after ctx_.deadline
  bool sent_tokens_ = false;
  bool prompt_opens_thinking_ = false;  // until the first response carries it
  double first_token_at_ = 0, last_token_at_ = 0, queue_seconds_ = 0;
  moe::internal::v1::WorkerGenerateResponse msg_;  // the message being written
};

}  // namespace moe::service
