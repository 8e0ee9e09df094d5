// WorkerService: requests -> engine::Request -> EngineLoop; tokenizer calls; info for routing.
#include "service/worker/worker_service.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/chat_template.h"
#include "kernels/base/clock.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "service/proto_convert.h"
#include "service/proto_validate.h"
#include "service/security.h"
#include "service/status_convert.h"
#include "service/worker/generate_stream.h"

namespace moe::service {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& st) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

}  // namespace

WorkerService::WorkerService(WorkerOptions options, const engine::Model& model,
                             const engine::Tokenizer& tokenizer, EngineLoop& loop,
                             metrics::WorkerMetrics& metrics)
    : options_(std::move(options)),
      model_(model),
      tokenizer_(tokenizer),
      loop_(loop),
      metrics_(metrics),
      readiness_(options_.max_consecutive_faults),
      instance_id_(absl::StrCat(getpid(), "-", base::NowMicros())) {
  const engine::ModelConfig& c = model_.config();
  info_.set_name(options_.model_name);
  info_.set_architecture(c.arch.model_type);
  info_.set_context_length(options_.context_length);
  info_.set_vocab_size(c.vocab_size);
  info_.set_num_layers(static_cast<uint32_t>(c.num_hidden_layers));
  info_.set_num_experts(static_cast<uint32_t>(c.num_experts));
  info_.set_num_experts_per_token(static_cast<uint32_t>(c.num_experts_per_tok));
  info_.set_expert_format(options_.expert_format);
  info_.set_device_budget_bytes(options_.device_budget_bytes);
  info_.set_host_budget_bytes(options_.host_budget_bytes);
  info_.set_kv_cache_format(options_.kv_cache_format);
  info_.set_kv_budget_bytes(options_.kv_budget_bytes);
  metrics_.SetModelInfo(options_.model_name, c.arch.model_type);
  metrics_.SetServing(true);
  readiness_.SetListener([this](const std::string& reason) {
    if (reason != "draining") {
      MOE_LOG(ERROR) << "[worker] not serving: " << reason;
    }
    metrics_.SetServing(false);
    if (grpc::HealthCheckServiceInterface* health = health_.load()) {
      for (const char* service : {"", "moe.internal.v1.Worker", "readiness"}) {
        health->SetServingStatus(service, false);
      }
    }
  });
}

void WorkerService::SetHealth(grpc::HealthCheckServiceInterface* health) {
  health_ = health;
  const bool serving = readiness_.serving();
  for (const char* service : {"", "moe.internal.v1.Worker", "readiness"}) {
    health->SetServingStatus(service, serving);
  }
  // Serving as long as the process runs: a drain or a fault must not get it restarted in a loop.
  health->SetServingStatus("liveness", true);
}

void WorkerService::StartDrain() { readiness_.StartDrain(); }

absl::Status WorkerService::CheckModel(const std::string& model) const {
  if (model.empty()) return absl::InvalidArgumentError("model: is required (see ListModels)");
  if (model != options_.model_name) {
    return absl::NotFoundError(absl::StrCat("model '", model,
                                            "' is not served here (this worker "
                                            "serves '",
                                            options_.model_name, "')"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> WorkerService::ChatPrompt(const moe::v1::ChatMessages& chat,
                                                               bool* opens_thinking) const {
  absl::StatusOr<ChatTemplateInput> in = ToChatTemplateInput(chat);
  if (!in.ok()) return in.status();
  absl::StatusOr<std::string> text = tokenizer_.chat_template().Render(
      in->messages, in->tools, in->kwargs, /*add_generation_prompt=*/true);
  if (!text.ok()) return base::Annotate(text.status(), "chat template");
  if (opens_thinking != nullptr) *opens_thinking = engine::PromptOpensThinking(*text);
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(*text);
  if (!ids.ok()) return base::Annotate(ids.status(), "chat");
  return ids;
}

absl::StatusOr<std::vector<int32_t>> WorkerService::Prompt(const moe::v1::GenerateRequest& r,
                                                           bool* opens_thinking) const {
  switch (r.input_case()) {
    case moe::v1::GenerateRequest::kText: {
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(r.text());
      if (!ids.ok()) return base::Annotate(ids.status(), "text");
      if (ids->empty()) return absl::InvalidArgumentError("text: tokenizes to no tokens");
      return ids;
    }
    case moe::v1::GenerateRequest::kChat:
      return ChatPrompt(r.chat(), opens_thinking);
    case moe::v1::GenerateRequest::kTokenIds:
      return std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end());
    case moe::v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("input: one of text, chat or token_ids is required");
}

grpc::ServerWriteReactor<moe::internal::v1::WorkerGenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const moe::internal::v1::WorkerGenerateRequest* wreq) {
  const moe::v1::GenerateRequest& r = wreq->request();
  GenerateStream::Context sctx;
  sctx.client_request_id = r.request_id();
  // The worker's own id, not the client's request_id: client ids need not be unique, and the
  // engine refuses an id that is already live.
  sctx.engine_id = absl::StrCat("r", next_id_.fetch_add(1));
  sctx.worker_name = options_.name;
  sctx.frontend_queue_seconds = wreq->frontend_queue_seconds();
  sctx.frontend_elapsed_seconds = wreq->frontend_elapsed_seconds();
  // top_logprobs counts only with logprobs (moe.v1): without it, no logprobs at all.
  sctx.logprobs = r.logprobs();
  sctx.readiness = &readiness_;
  sctx.deadline = context->deadline();
  std::shared_ptr<GenerateStream> stream = GenerateStream::Create(sctx, loop_, metrics_);

  auto refuse = [&](const absl::Status& st) {
    metrics_.RequestFinished(CodeLabel(st.code()), 0, 0, 0);
    stream->Reject(ToGrpcStatus(st));
    return stream.get();
  };
  if (absl::Status st = CheckBearerToken(*context, options_.auth_token); !st.ok()) {
    return refuse(st);
  }
  if (!readiness_.serving()) {
    return refuse(absl::UnavailableError(absl::StrCat("worker is not serving: ", readiness_.reason())));
  }
  if (absl::Status st = CheckModel(r.model()); !st.ok()) return refuse(st);
  // Validated again although the frontend did: the worker API is reachable without it.
  const ModelLimits limits{model_.config().vocab_size, options_.context_length};
  if (absl::Status st = ValidateGenerateRequest(r, limits); !st.ok()) return refuse(st);
  // Tokenized here, on the gRPC thread: a long prompt never delays the engine thread's steps.
  bool opens_thinking = false;
  absl::StatusOr<std::vector<int32_t>> prompt = Prompt(r, &opens_thinking);
  if (!prompt.ok()) return refuse(prompt.status());
  const int64_t n = static_cast<int64_t>(prompt->size());
  if (n >= options_.context_length) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat(r.has_chat() ? "chat" : "text", ": the prompt has ", n,
                     " tokens; the context length is ", options_.context_length)));
  }

  if (opens_thinking) stream->SetPromptOpensThinking();
  engine::Request er;
  er.id = sctx.engine_id;
  er.prompt = std::move(*prompt);
  er.sampling = ToSamplingParams(r.sampling());
  er.stop = ToStopConditions(r, n, options_.context_length);
  er.return_logprobs = sctx.logprobs;
  er.top_logprobs = r.logprobs() ? static_cast<int32_t>(r.top_logprobs()) : 0;
  er.session_id = r.session_id();
  // moe.v1's default is true: generated special tokens stay in token_ids, not in the text.
  er.skip_special_tokens = !r.has_skip_special_tokens() || r.skip_special_tokens();
  loop_.Add(std::move(er), stream);
  return stream.get();
}

grpc::ServerUnaryReactor* WorkerService::Tokenize(grpc::CallbackServerContext* context,
                                                  const moe::v1::TokenizeRequest* request,
                                                  moe::v1::TokenizeResponse* response) {
  if (absl::Status st = CheckBearerToken(*context, options_.auth_token); !st.ok()) {
    return Answer(context, st);
  }
  if (absl::Status st = CheckModel(request->model()); !st.ok()) return Answer(context, st);
  if (absl::Status st = ValidateTokenizeRequest(*request); !st.ok()) return Answer(context, st);
  absl::StatusOr<std::vector<int32_t>> ids;
  if (request->has_chat()) {
    ids = ChatPrompt(request->chat());
  } else {
    ids = tokenizer_.Encode(request->text());
    if (!ids.ok()) ids = base::Annotate(ids.status(), "text");
  }
  if (!ids.ok()) return Answer(context, ids.status());
  for (int32_t id : *ids) response->add_token_ids(static_cast<uint32_t>(id));
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerService::Detokenize(grpc::CallbackServerContext* context,
                                                    const moe::v1::DetokenizeRequest* request,
                                                    moe::v1::DetokenizeResponse* response) {
  if (absl::Status st = CheckBearerToken(*context, options_.auth_token); !st.ok()) {
    return Answer(context, st);
  }
  if (absl::Status st = CheckModel(request->model()); !st.ok()) return Answer(context, st);
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  absl::StatusOr<std::string> text = tokenizer_.Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return Answer(context, base::Annotate(text.status(), "token_ids"));
  response->set_text(std::move(*text));
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerService::DropSession(grpc::CallbackServerContext* context,
                                                     const moe::v1::DropSessionRequest* request,
                                                     moe::v1::DropSessionResponse*) {
  if (absl::Status st = CheckBearerToken(*context, options_.auth_token); !st.ok()) {
    return Answer(context, st);
  }
  if (absl::Status st = CheckModel(request->model()); !st.ok()) return Answer(context, st);
  if (request->session_id().empty()) {
    return Answer(context, absl::InvalidArgumentError("session_id: is required"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  loop_.DropSession(request->session_id(),
                    [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::GetInfo(grpc::CallbackServerContext* context,
                                                 const moe::internal::v1::GetInfoRequest*,
                                                 moe::internal::v1::WorkerInfo* response) {
  if (absl::Status st = CheckBearerToken(*context, options_.auth_token); !st.ok()) {
    return Answer(context, st);
  }
  *response->mutable_model() = info_;
  response->set_serving(readiness_.serving());
  response->set_not_serving_reason(readiness_.reason());
  response->set_instance_id(instance_id_);
  const engine::EngineStats stats = loop_.stats();
  response->set_running_requests(static_cast<uint32_t>(stats.running));
  response->set_waiting_requests(static_cast<uint32_t>(stats.waiting));
  response->set_kv_bytes_used(static_cast<uint64_t>(stats.kv_bytes_used));
  response->set_max_running(static_cast<uint32_t>(options_.max_running));
  return Answer(context, absl::OkStatus());
}

}  // namespace moe::service
