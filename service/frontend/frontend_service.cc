// FrontendService: auth, Generate via GenerateCall, forwarded tokenizer calls, model listing.
#include "service/frontend/frontend_service.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "service/proto_validate.h"
#include "service/security.h"
#include "service/status_convert.h"

namespace moe::service {
namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const absl::Status& st) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

// A write reactor that only reports a status (refused before any work).
class Refusal final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Forwards a unary call to a worker; the worker's answer (or failure) becomes ours.
// `call(async_stub, client_context, done)` starts the worker's method.
template <typename Req, typename Call>
grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context, Router& router,
                                  const Req* request, Call call) {
  if (request->model().empty()) {
    return Answer(context, absl::InvalidArgumentError("model: is required (see ListModels)"));
  }
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> worker =
      router.Pick(request->model(), /*session_id=*/"", {});
  if (!worker.ok()) return Answer(context, worker.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<grpc::ClientContext> client =
      grpc::ClientContext::FromCallbackServerContext(*context);
  (*worker)->Authorize(client.get());
  // The lambda keeps the client context and the worker alive until the answer.
  call((*worker)->stub().async(), client.get(),
       [reactor, client, keep = *worker](grpc::Status status) { reactor->Finish(status); });
  return reactor;
}

}  // namespace

FrontendService::FrontendService(FrontendOptions options, WorkerSet& workers, Router& router,
                                 Admission& admission, metrics::FrontendMetrics& metrics)
    : options_(std::move(options)),
      workers_(workers),
      router_(router),
      admission_(admission),
      metrics_(metrics) {
  fe_.router = &router_;
  fe_.admission = &admission_;
  fe_.metrics = &metrics_;
  fe_.max_attempts = options_.max_attempts;
}

absl::Status FrontendService::CheckCall(const grpc::CallbackServerContext& context,
                                        size_t request_bytes, absl::string_view method) {
  if (absl::Status st = CheckBearerToken(context, options_.auth_token); !st.ok()) return st;
  if (options_.max_request_bytes > 0 &&
      request_bytes > static_cast<uint64_t>(options_.max_request_bytes)) {
    metrics_.Oversized(method);
    return absl::ResourceExhaustedError(absl::StrCat("request: ", request_bytes,
                                                     " bytes is over the limit of ",
                                                     options_.max_request_bytes, " bytes"));
  }
  return absl::OkStatus();
}

void FrontendService::StartDrain() {
  draining_ = true;
  admission_.Close();
}

std::map<std::string, moe::v1::ModelInfo> FrontendService::Models() const {
  std::map<std::string, moe::v1::ModelInfo> models;
  for (const auto& w : workers_.Snapshot()) {
    if (!w->has_model()) continue;
    moe::v1::ModelInfo info = w->model();
    auto [it, inserted] = models.emplace(info.name(), info);
    if (inserted) it->second.set_ready_workers(0);
    if (w->up()) it->second.set_ready_workers(it->second.ready_workers() + 1);
  }
  return models;
}

void FrontendService::UpdateHealth(grpc::HealthCheckServiceInterface* health) {
  if (health == nullptr) return;
  const bool serving = !draining_;
  std::map<std::string, bool> status;
  status[""] = serving;
  status["moe.v1.Inference"] = serving;
  status["liveness"] = true;  // a drain must not get the process killed
  bool any_model = false;
  for (const auto& [name, info] : Models()) {
    status["model/" + name] = serving && info.ready_workers() > 0;
    any_model = any_model || info.ready_workers() > 0;
  }
  // Ready for traffic: admitting, and some worker can serve.
  status["readiness"] = serving && any_model;
  // gRPC's health service sends every SetServingStatus to every Watch, changed or not: set only
  // what changed since the last poll.
  std::lock_guard<std::mutex> lock(health_mu_);
  for (const auto& [service, up] : status) {
    auto [it, inserted] = health_sent_.try_emplace(service, up);
    if (!inserted && it->second == up) continue;
    it->second = up;
    health->SetServingStatus(service, up);
  }
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* FrontendService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  if (absl::Status st = CheckCall(*context, raw->Length(), "Generate"); !st.ok()) {
    metrics_.RequestFinished(CodeLabel(st.code()));
    return new Refusal(ToGrpcStatus(st));
  }
  if (draining_) {
    metrics_.RequestFinished("unavailable");
    return new Refusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the frontend is draining"));
  }
  grpc::ByteBuffer copy(*raw);  // Deserialize consumes its buffer; slices are shared, not copied
  moe::v1::GenerateRequest request;
  if (grpc::Status st =
          grpc::SerializationTraits<moe::v1::GenerateRequest>::Deserialize(&copy, &request);
      !st.ok()) {
    metrics_.RequestFinished("invalid_argument");
    // proto3 refuses a string field that is not UTF-8 without saying which: find it.
    std::string bytes;
    if (grpc::Slice slice; raw->DumpToSingleSlice(&slice).ok()) {
      bytes.assign(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    const std::string field = InvalidUtf8Field(*moe::v1::GenerateRequest::descriptor(), bytes);
    return new Refusal(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        field.empty() ? "request: not a moe.v1.GenerateRequest (" + st.error_message() + ")"
                      : field + ": is not valid UTF-8"));
  }
  GenerateCall* call = nullptr;
  GenerateCall::Start(&fe_, context, &request, &call);
  return call;
}

grpc::ServerUnaryReactor* FrontendService::Tokenize(grpc::CallbackServerContext* context,
                                                    const moe::v1::TokenizeRequest* request,
                                                    moe::v1::TokenizeResponse* response) {
  if (absl::Status st = CheckCall(*context, request->ByteSizeLong(), "Tokenize"); !st.ok()) {
    return Answer(context, st);
  }
  if (absl::Status st = ValidateTokenizeRequest(*request); !st.ok()) return Answer(context, st);
  return Forward(context, router_, request, [&](auto* stub, grpc::ClientContext* ctx, auto done) {
    stub->Tokenize(ctx, request, response, std::move(done));
  });
}

grpc::ServerUnaryReactor* FrontendService::Detokenize(grpc::CallbackServerContext* context,
                                                      const moe::v1::DetokenizeRequest* request,
                                                      moe::v1::DetokenizeResponse* response) {
  if (absl::Status st = CheckCall(*context, request->ByteSizeLong(), "Detokenize"); !st.ok()) {
    return Answer(context, st);
  }
  return Forward(context, router_, request, [&](auto* stub, grpc::ClientContext* ctx, auto done) {
    stub->Detokenize(ctx, request, response, std::move(done));
  });
}

grpc::ServerUnaryReactor* FrontendService::DropSession(grpc::CallbackServerContext* context,
                                                       const moe::v1::DropSessionRequest* request,
                                                       moe::v1::DropSessionResponse* response) {
  if (absl::Status st = CheckCall(*context, request->ByteSizeLong(), "DropSession"); !st.ok()) {
    return Answer(context, st);
  }
  if (request->model().empty()) {
    return Answer(context, absl::InvalidArgumentError("model: is required (see ListModels)"));
  }
  if (request->session_id().empty()) {
    return Answer(context, absl::InvalidArgumentError("session_id: is required"));
  }
  std::shared_ptr<WorkerEndpoint> worker = router_.SessionWorker(request->session_id());
  if (worker == nullptr) {
    return Answer(context, absl::NotFoundError(
                               absl::StrCat("session '", request->session_id(), "' is not known")));
  }
  router_.Unbind(request->session_id());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::shared_ptr<grpc::ClientContext> client =
      grpc::ClientContext::FromCallbackServerContext(*context);
  worker->Authorize(client.get());
  worker->stub().async()->DropSession(
      client.get(), request, response,
      [reactor, client, worker](grpc::Status status) { reactor->Finish(status); });
  return reactor;
}

grpc::ServerUnaryReactor* FrontendService::ListModels(grpc::CallbackServerContext* context,
                                                      const moe::v1::ListModelsRequest*,
                                                      moe::v1::ListModelsResponse* response) {
  if (absl::Status st = CheckCall(*context, 0, "ListModels"); !st.ok()) {
    return Answer(context, st);
  }
  for (auto& [name, info] : Models()) {
    if (info.ready_workers() > 0) *response->add_models() = info;
  }
  return Answer(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* FrontendService::GetModel(grpc::CallbackServerContext* context,
                                                    const moe::v1::GetModelRequest* request,
                                                    moe::v1::ModelInfo* response) {
  if (absl::Status st = CheckCall(*context, request->ByteSizeLong(), "GetModel"); !st.ok()) {
    return Answer(context, st);
  }
  if (request->model().empty()) {
    return Answer(context, absl::InvalidArgumentError("model: is required (see ListModels)"));
  }
  const auto models = Models();
  auto it = models.find(request->model());
  // As ListModels: a model no up worker serves is not served (the API's NOT_FOUND).
  if (it == models.end() || it->second.ready_workers() == 0) {
    return Answer(
        context, absl::NotFoundError(absl::StrCat("model '", request->model(), "' is not served",
                                                  it == models.end() ? "" : " (no worker is up)")));
  }
  *response = it->second;
  return Answer(context, absl::OkStatus());
}

}  // namespace moe::service
