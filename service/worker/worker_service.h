// WorkerService: the internal moe.internal.v1.Worker API over one model and its engine loop.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "moe/internal/v1/worker.grpc.pb.h"
#include "service/metrics/worker_metrics.h"
#include "service/worker/engine_loop.h"
#include "service/worker/readiness.h"

namespace moe::service {

struct WorkerOptions {
  std::string name;            // reported in Completion.worker. Default: the listen address
  std::string model_name;      // what requests call the model
  std::string kv_cache_format = "bf16";  // the engine's kv_cache_dtype
  int64_t context_length = 0;  // the engine's max context
  int64_t max_running = 0;     // the engine's max_running
  int64_t kv_budget_bytes = 0;
  std::string expert_format;         // as moe.v1 ModelInfo documents it: "bf16", "int4-g64"
  uint64_t device_budget_bytes = 0;  // expert store tiers (0: off)
  uint64_t host_budget_bytes = 0;
  // Requests in a row failing with a worker fault (Readiness) that turn the worker NOT_SERVING.
  int max_consecutive_faults = 5;
  // When set, every worker API call needs "authorization: Bearer <token>". Default: off
  std::string auth_token;
};

// Thread-safe. `model`, `tokenizer`, `loop` and `metrics` must outlive it.
class WorkerService final : public moe::internal::v1::Worker::CallbackService {
 public:
  WorkerService(WorkerOptions options, const engine::Model& model,
                const engine::Tokenizer& tokenizer, EngineLoop& loop,
                metrics::WorkerMetrics& metrics);

  // From now on Generate answers UNAVAILABLE and GetInfo says not serving; running streams go on.
  void StartDrain();
  bool serving() const { return readiness_.serving(); }
  // Once the server is built: readiness changes (drain, repeated worker faults) turn the
  // services "", moe.internal.v1.Worker and readiness NOT_SERVING there. Must outlive this.
  void SetHealth(grpc::HealthCheckServiceInterface* health);

  // The model as GetModel reports it.
  const moe::v1::ModelInfo& model_info() const { return info_; }

  grpc::ServerWriteReactor<moe::internal::v1::WorkerGenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const moe::internal::v1::WorkerGenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const moe::v1::TokenizeRequest* request,
                                     moe::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const moe::v1::DetokenizeRequest* request,
                                       moe::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* DropSession(grpc::CallbackServerContext* context,
                                        const moe::v1::DropSessionRequest* request,
                                        moe::v1::DropSessionResponse* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const moe::internal::v1::GetInfoRequest* request,
                                    moe::internal::v1::WorkerInfo* response) override;

 private:
  // Text (tokenized as is), chat (rendered with the chat template) or ids -> prompt ids.
  // InvalidArgument names the field. *opens_thinking (may be null) is set for a chat whose
  // rendered prompt ends inside an open <think> block (engine::PromptOpensThinking).
  absl::StatusOr<std::vector<int32_t>> Prompt(const moe::v1::GenerateRequest& request,
                                              bool* opens_thinking) const;
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(const moe::v1::ChatMessages& chat,
                                                  bool* opens_thinking = nullptr) const;
  absl::Status CheckModel(const std::string& model) const;

  const WorkerOptions options_;
  const engine::Model& model_;
  const engine::Tokenizer& tokenizer_;
  EngineLoop& loop_;
  metrics::WorkerMetrics& metrics_;
  moe::v1::ModelInfo info_;
  Readiness readiness_;
  const std::string instance_id_;  // WorkerInfo.instance_id
  std::atomic<grpc::HealthCheckServiceInterface*> health_{nullptr};
  std::atomic<int64_t> next_id_{0};
};

}  // namespace moe::service
