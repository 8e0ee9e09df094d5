// FrontendService: the public moe.v1.Inference API. Generate goes through GenerateCall;
// Tokenize/Detokenize are forwarded to a worker serving the model; ListModels/GetModel answer
// from the workers' last reports.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "moe/v1/moe.grpc.pb.h"
#include "service/frontend/admission.h"
#include "service/frontend/generate_call.h"
#include "service/frontend/router.h"
#include "service/frontend/worker_set.h"
#include "service/metrics/frontend_metrics.h"

namespace moe::service {

struct FrontendOptions {
  std::string auth_token;  // when set, calls need "authorization: Bearer <token>". Default: off
  int max_attempts = 3;    // workers tried before the first token. Default: 3
  // Larger requests get RESOURCE_EXHAUSTED, counted. 0: not checked here (gRPC's own limit,
  // which refuses uncounted, must then be the only one).
  int64_t max_request_bytes = 0;
};

// Thread-safe. Everything passed in must outlive it.
// Generate is registered raw (ByteBuffer in and out) so that parsing is ours: a message that is
// not a GenerateRequest gets INVALID_ARGUMENT (gRPC 1.51's typed callback handler answers
// UNIMPLEMENTED). Reflection still describes the typed method.
class FrontendService final : public moe::v1::Inference::WithRawCallbackMethod_Generate<
                                  moe::v1::Inference::CallbackService> {
 public:
  FrontendService(FrontendOptions options, WorkerSet& workers, Router& router, Admission& admission,
                  metrics::FrontendMetrics& metrics);

  // Health: "" and "moe.v1.Inference" serve while the frontend admits work; "model/<name>"
  // while some worker serving <name> is up; "readiness" while both hold for some model;
  // "liveness" always (for Kubernetes gRPC probes). Call after every worker poll.
  void UpdateHealth(grpc::HealthCheckServiceInterface* health);
  // Refuses new calls (UNAVAILABLE); running ones go on.
  void StartDrain();
  // The drain's time is up: running and queued calls end with a last message whose Completion
  // says FINISH_REASON_CANCELLED, status OK (as a worker's drain ends its streams).
  void CutRunning() { CutAll(&fe_); }

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const moe::v1::TokenizeRequest* request,
                                     moe::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const moe::v1::DetokenizeRequest* request,
                                       moe::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const moe::v1::ListModelsRequest* request,
                                       moe::v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* DropSession(grpc::CallbackServerContext* context,
                                        const moe::v1::DropSessionRequest* request,
                                        moe::v1::DropSessionResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const moe::v1::GetModelRequest* request,
                                     moe::v1::ModelInfo* response) override;

 private:
  // UNAUTHENTICATED unless the call carries the bearer token (when one is configured);
  // RESOURCE_EXHAUSTED, counted by `method`, when its request has more than max_request_bytes.
  absl::Status CheckCall(const grpc::CallbackServerContext& context, size_t request_bytes,
                         absl::string_view method);
  // The served models, with ready_workers counted.
  std::map<std::string, moe::v1::ModelInfo> Models() const;

  const FrontendOptions options_;
  WorkerSet& workers_;
  Router& router_;
  Admission& admission_;
  metrics::FrontendMetrics& metrics_;
  FrontendContext fe_;
  std::atomic<bool> draining_{false};
  std::mutex health_mu_;
  std::map<std::string, bool> health_sent_;  // what UpdateHealth last set; guarded by health_mu_
};

}  // namespace moe::service
