// GenerateCall: one client Generate call at the frontend. It validates, enters admission,
// opens a Worker.Generate stream on the routed worker (deadline propagated), and relays
// messages one at a time (read upstream -> write to client -> read again), so a slow client
// slows its worker stream instead of buffering. A worker that is unavailable before the first
// token is retried on another (up to max_attempts); one that fails the request itself
// (DATA_LOSS, INTERNAL) is retried on another once; after the first token, the call ends
// UNAVAILABLE. Client cancellation or deadline
// cancels the worker stream (the worker then frees the sequence's KV).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "moe/internal/v1/worker.grpc.pb.h"
#include "moe/v1/moe.grpc.pb.h"
#include "service/frontend/admission.h"
#include "service/frontend/router.h"
#include "service/metrics/frontend_metrics.h"

namespace moe::service {

class GenerateCall;

// What every call shares; owned by the FrontendService.
struct FrontendContext {
  Router* router = nullptr;
  Admission* admission = nullptr;
  metrics::FrontendMetrics* metrics = nullptr;
  int max_attempts = 3;  // workers tried before the first token

  // Calls whose client side is not done yet, for CutAll at the end of a drain.
  std::mutex calls_mu;
  std::set<GenerateCall*> calls;  // guarded by calls_mu
};

// The end of a drain: every live call ends as the worker's drain ends its streams, with a last
// message whose Completion says FINISH_REASON_CANCELLED (usage: the tokens sent) and status OK.
// Thread-safe; returns at once (the calls end on gRPC's threads, or on this one).
void CutAll(FrontendContext* fe);

// Writes serialized GenerateResponse messages: Generate is a raw method (see FrontendService),
// so that a request that does not parse gets INVALID_ARGUMENT instead of gRPC's UNIMPLEMENTED.
class GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Starts the call; it deletes itself when both the client call and any worker stream are done.
  static void Start(FrontendContext* fe, grpc::CallbackServerContext* context,
                    const moe::v1::GenerateRequest* request, GenerateCall** out);
  // See CutAll. Requires fe->calls_mu (the call cannot be deleted meanwhile); `then` collects
  // what must run after it is released.
  void Cut(std::vector<std::function<void()>>* then);

 private:
  class Upstream;
  GenerateCall(FrontendContext* fe, grpc::CallbackServerContext* context,
               const moe::v1::GenerateRequest* request);

  void Begin();
  void Attempt();  // runs once admitted, and again for each retry
  void OnUpstreamMessage(Upstream* up);
  void OnUpstreamDone(Upstream* up, const grpc::Status& status);
  // Decides what a finished worker stream means: done, retry elsewhere, or an error.
  void Conclude(const grpc::Status& status);
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // Ends the client call once (records the outcome, frees the admission slot), after writing
  // `last` when given.
  void End(const grpc::Status& status, const std::string& outcome,
           const moe::v1::GenerateResponse* last = nullptr);
  // Ends a call cut by CutAll that the worker did not complete: a last message of our own.
  void EndCut();
  void MaybeDelete(std::unique_lock<std::mutex>& lock);

  FrontendContext* const fe_;
  grpc::CallbackServerContext* const context_;
  moe::v1::GenerateRequest request_;
  const double arrival_;
  int64_t estimated_tokens_ = 0;
  std::vector<uint64_t> prefix_;  // Router::PrefixChain of the prompt

  std::mutex mu_;
  Upstream* upstream_ = nullptr;  // the live worker stream, if any
  std::set<std::string> tried_;
  uint64_t ticket_ = 0;
  bool admitted_ = false, queued_ = false;
  bool cancelled_ = false, writing_ = false, ended_ = false, server_done_ = false;
  bool relayed_ = false;  // a message reached the client: no more retries
  bool fault_retried_ = false;  // a worker fault (WorkerFault) was retried: not again
  bool cut_ = false;            // CutAll: end with FINISH_REASON_CANCELLED, status OK
  std::shared_ptr<grpc::ClientContext> upstream_ctx_;  // of upstream_; outlives it for Cut
  std::string worker_name_;                            // of the last attempt, for EndCut
  moe::v1::FinishReason completion_reason_ = moe::v1::FINISH_REASON_UNSPECIFIED;
  double admitted_at_ = 0, first_token_at_ = 0, last_token_at_ = 0;
  int64_t tokens_sent_ = 0;
  std::optional<grpc::Status> upstream_status_;  // arrived while a client write was in flight
  moe::v1::GenerateResponse out_;
  grpc::ByteBuffer out_bytes_;  // out_, serialized for the write in flight
};

}  // namespace moe::service
