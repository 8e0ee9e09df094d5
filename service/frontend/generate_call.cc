// GenerateCall: validate -> admit -> route -> relay, with retries before the first token.
#include "service/frontend/generate_call.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "kernels/base/clock.h"
#include "kernels/base/log.h"
#include "service/proto_validate.h"
#include "service/status_convert.h"

namespace moe::service {
namespace {

std::atomic<uint64_t> g_request_counter{0};

// Tokens the request may still cost its worker, for least-loaded routing. Text is estimated at
// four bytes per token; the exact count is known only to the worker's tokenizer.
int64_t EstimateTokens(const moe::v1::GenerateRequest& r) {
  int64_t prompt = 0;
  if (r.has_token_ids()) prompt = r.token_ids().ids_size();
  if (r.has_text()) prompt = static_cast<int64_t>(r.text().size()) / 4 + 1;
  if (r.has_chat()) {
    for (const auto& m : r.chat().messages())
      prompt += static_cast<int64_t>(m.content().size()) / 4 + 4;
  }
  return prompt + (r.has_max_tokens() ? r.max_tokens() : kDefaultMaxTokens);
}

// Failures that say "this worker could not serve it", worth another worker before any token.
bool Retryable(const grpc::Status& s) { return s.error_code() == grpc::StatusCode::UNAVAILABLE; }

// The worker failed the request itself (an unreadable expert store, a backend error): another
// worker may well serve it, but the request might also be what fails, so it is tried once more.
bool WorkerFault(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::DATA_LOSS ||
         s.error_code() == grpc::StatusCode::INTERNAL ||
         s.error_code() == grpc::StatusCode::UNKNOWN;
}

const char* FinishLabel(moe::v1::FinishReason r) {
  switch (r) {
    case moe::v1::FINISH_REASON_STOP:
      return "stop";
    case moe::v1::FINISH_REASON_LENGTH:
      return "length";
    case moe::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case moe::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "unknown";
  }
}

}  // namespace

// One Worker.Generate stream. It keeps a hold (AddHold) until its last read failed, so OnDone
// (after which it is deleted) cannot run while the call may still ask it to read.
class GenerateCall::Upstream final
    : public grpc::ClientReadReactor<moe::internal::v1::WorkerGenerateResponse> {
 public:
  Upstream(GenerateCall* call, std::shared_ptr<WorkerEndpoint> worker, int64_t estimate)
      : call_(call),
        // Propagates the client's deadline and cancellation to the worker stream.
        ctx_(grpc::ClientContext::FromCallbackServerContext(*call->context_)),
        worker_(std::move(worker)),
        remaining_(estimate) {
    worker_->Authorize(ctx_.get());
    worker_->streams.fetch_add(1);
    worker_->outstanding_tokens.fetch_add(remaining_);
  }
  ~Upstream() override {
    worker_->streams.fetch_sub(1);
    worker_->outstanding_tokens.fetch_sub(remaining_);
  }

  void Begin() {
    worker_->stub().async()->Generate(ctx_.get(), &request_, this);
    AddHold();
    StartRead(&response_);
    StartCall();
  }
  void ReadNext() { StartRead(&response_); }
  void Cancel() { ctx_->TryCancel(); }
  std::shared_ptr<grpc::ClientContext> context() const { return ctx_; }
  void Consumed(int64_t tokens) {
    const int64_t n = std::min(tokens, remaining_);
    remaining_ -= n;
    worker_->outstanding_tokens.fetch_sub(n);
  }

  moe::internal::v1::WorkerGenerateRequest request_;
  moe::internal::v1::WorkerGenerateResponse response_;
  WorkerEndpoint& worker() { return *worker_; }

 private:
  void OnReadDone(bool ok) override {
    if (ok) {
      call_->OnUpstreamMessage(this);
    } else {
      RemoveHold();  // the stream is over; OnDone brings its status
    }
  }
  void OnDone(const grpc::Status& status) override {
    call_->OnUpstreamDone(this, status);
    delete this;
  }

  GenerateCall* const call_;
  std::shared_ptr<grpc::ClientContext> ctx_;
  std::shared_ptr<WorkerEndpoint> worker_;
  int64_t remaining_;
};

void GenerateCall::Start(FrontendContext* fe, grpc::CallbackServerContext* context,
                         const moe::v1::GenerateRequest* request, GenerateCall** out) {
  auto* call = new GenerateCall(fe, context, request);
  *out = call;
  {
    std::lock_guard<std::mutex> lock(fe->calls_mu);
    fe->calls.insert(call);
  }
  call->Begin();
}

void CutAll(FrontendContext* fe) {
  std::vector<std::function<void()>> then;
  {
    std::lock_guard<std::mutex> lock(fe->calls_mu);
    for (GenerateCall* call : fe->calls) call->Cut(&then);
  }
  // Outside calls_mu: a cancelled stream may end its call (and delete it) on this thread.
  for (std::function<void()>& f : then) f();
}

void GenerateCall::Cut(std::vector<std::function<void()>>* then) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_ || cancelled_ || cut_) return;
  cut_ = true;
  if (upstream_ != nullptr) {
    // The worker stream ends CANCELLED; Conclude then sees cut_. The context outlives the
    // Upstream, which may be gone by the time this runs.
    then->push_back([ctx = upstream_ctx_] { ctx->TryCancel(); });
  } else if (!admitted_ && ticket_ != 0) {
    // Waiting for admission: once withdrawn, nothing else ends it (and it cannot be deleted).
    then->push_back([this, admission = fe_->admission, ticket = ticket_] {
      if (admission->Withdraw(ticket)) EndCut();
    });
  }
  // Otherwise it is between attempts: Attempt sees cut_.
}

GenerateCall::GenerateCall(FrontendContext* fe, grpc::CallbackServerContext* context,
                           const moe::v1::GenerateRequest* request)
    : fe_(fe), context_(context), request_(*request), arrival_(base::NowSeconds()) {}

void GenerateCall::Begin() {
  absl::StatusOr<ModelLimits> limits = fe_->router->Limits(request_.model());
  if (request_.model().empty()) limits = ModelLimits{};  // validation names the field
  if (!limits.ok()) return End(ToGrpcStatus(limits.status()), CodeLabel(limits.status().code()));
  if (absl::Status st = ValidateGenerateRequest(request_, *limits); !st.ok()) {
    return End(ToGrpcStatus(st), CodeLabel(st.code()));
  }
  if (request_.request_id().empty()) {
    request_.set_request_id(absl::StrCat("req-", base::NowMicros(), "-", g_request_counter++));
  }
  estimated_tokens_ = EstimateTokens(request_);
  prefix_ = fe_->router->PrefixChain(request_);
  absl::StatusOr<uint64_t> ticket = fe_->admission->Enter([this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      admitted_ = true;
      admitted_at_ = base::NowSeconds();
    }
    Attempt();
  });
  if (!ticket.ok()) {
    if (ticket.status().code() == absl::StatusCode::kResourceExhausted) {
      // gRFC A6: a client with a retry policy waits this long before retrying.
      context_->AddTrailingMetadata("grpc-retry-pushback-ms", "500");
    }
    return End(ToGrpcStatus(ticket.status()), CodeLabel(ticket.status().code()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ticket_ = *ticket;
}

void GenerateCall::Attempt() {
  std::set<std::string> tried;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tried = tried_;
  }
  RouteReason reason = RouteReason::kLeastLoad;
  absl::StatusOr<std::shared_ptr<WorkerEndpoint>> worker =
      fe_->router->Pick(request_.model(), request_.session_id(), tried, prefix_, &reason);
  if (!worker.ok()) return End(ToGrpcStatus(worker.status()), CodeLabel(worker.status().code()));
  fe_->metrics->Routed(RouteReasonLabel(reason));
  auto* up = new Upstream(this, *worker, estimated_tokens_);
  const double now = base::NowSeconds();
  *up->request_.mutable_request() = request_;
  bool cancelled = false, cut = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    up->request_.set_frontend_queue_seconds(admitted_at_ - arrival_);
    up->request_.set_frontend_elapsed_seconds(now - arrival_);
    cancelled = cancelled_;
    cut = cut_;
    if (!cancelled && !cut) {
      upstream_ = up;
      upstream_ctx_ = up->context();
      worker_name_ = (*worker)->target();
      tried_.insert((*worker)->target());
    }
  }
  if (cancelled || cut) {
    delete up;
    if (cut && !cancelled) return EndCut();
    return End(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"), "cancelled");
  }
  up->Begin();
}

void GenerateCall::OnUpstreamMessage(Upstream* up) {
  const double now = base::NowSeconds();
  std::unique_lock<std::mutex> lock(mu_);
  if (cancelled_ || ended_) {
    lock.unlock();
    up->Cancel();    // propagation should have done it; make sure
    up->ReadNext();  // runs into the cancellation and ends the stream
    return;
  }
  out_.Swap(up->response_.mutable_response());
  const int k = out_.token_ids_size();
  up->Consumed(k);
  if (k > 0) {
    if (first_token_at_ == 0) {
      first_token_at_ = now;
      fe_->metrics->ObserveTtft(now - arrival_);
      fe_->router->Bind(request_.session_id(), up->worker().target());
    } else {
      for (int i = 0; i < k; ++i) fe_->metrics->ObserveItl((now - last_token_at_) / k);
    }
    last_token_at_ = now;
    tokens_sent_ += k;
  }
  if (out_.has_completion()) {
    // The worker measured from the frontend's arrival time by offset; these are exact.
    moe::v1::Timings* t = out_.mutable_completion()->mutable_timings();
    if (first_token_at_ > 0) t->set_time_to_first_token_seconds(first_token_at_ - arrival_);
    t->set_total_seconds(now - arrival_);
    completion_reason_ = out_.completion().finish_reason();
  }
  relayed_ = true;
  writing_ = true;
  bool own = false;
  out_bytes_.Clear();  // the serializer wants an empty buffer; the last write is done with it
  const grpc::Status serialized =
      grpc::SerializationTraits<moe::v1::GenerateResponse>::Serialize(out_, &out_bytes_, &own);
  lock.unlock();
  if (!serialized.ok()) {  // cannot happen for a message we built; end cleanly if it does
    up->Cancel();
    up->ReadNext();
    return;
  }
  StartWrite(&out_bytes_);
}

void GenerateCall::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) cancelled_ = true;  // the client went away; the propagated cancel ends upstream
  if (upstream_status_) {
    const grpc::Status status = *upstream_status_;
    lock.unlock();
    return Conclude(status);
  }
  Upstream* up = upstream_;
  lock.unlock();
  // The upstream holds a hold until its read fails, so it is alive here.
  if (up != nullptr) {
    if (!ok) up->Cancel();
    up->ReadNext();
  }
}

void GenerateCall::OnUpstreamDone(Upstream* up, const grpc::Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  upstream_ = nullptr;
  if ((Retryable(status) || WorkerFault(status)) && !cancelled_) {
    // Counted per attempt: a failure retried elsewhere is invisible to the client.
    fe_->metrics->WorkerFailed(CodeLabel(FromGrpcStatus(status).code()));
    if (Retryable(status)) up->worker().MarkDown(status.error_message());
  }
  if (writing_) {
    upstream_status_ = status;  // OnWriteDone concludes
    return;
  }
  lock.unlock();
  Conclude(status);
}

void GenerateCall::Conclude(const grpc::Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  upstream_status_.reset();
  const bool cancelled = cancelled_;
  const bool cut = cut_;
  const bool relayed = relayed_;
  const int attempts = static_cast<int>(tried_.size());
  const int64_t tokens = tokens_sent_;
  const moe::v1::FinishReason reason = completion_reason_;
  lock.unlock();
  // The client's deadline may reach the worker stream (propagated) before OnCancel runs here.
  const bool upstream_timed_out = (status.error_code() == grpc::StatusCode::CANCELLED ||
                                   status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
                                  DeadlinePassed(context_->deadline());
  if (cancelled || upstream_timed_out) {
    const bool deadline = DeadlinePassed(context_->deadline());
    return End(
        grpc::Status(deadline ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED,
                     deadline ? "deadline exceeded" : "cancelled"),
        deadline ? "deadline_exceeded" : "cancelled");
  }
  // Cut by the drain before the worker's last message: the completion is ours to send.
  if (cut && reason == moe::v1::FINISH_REASON_UNSPECIFIED) return EndCut();
  if (status.ok()) return End(status, FinishLabel(reason));
  if (Retryable(status) && !relayed && attempts < fe_->max_attempts) {
    MOE_LOG(WARNING) << "[frontend] " << request_.request_id() << ": worker failed before the "
                     << "first token (" << status.error_message() << "); retrying elsewhere";
    fe_->metrics->Retried();
    return Attempt();
  }
  if (WorkerFault(status) && !relayed && attempts < fe_->max_attempts) {
    lock.lock();
    const bool first_fault = !fault_retried_;
    fault_retried_ = true;
    lock.unlock();
    if (first_fault) {
      MOE_LOG(WARNING) << "[frontend] " << request_.request_id() << ": worker failed the request "
                       << "before the first token (" << status.error_message()
                       << "); retrying once elsewhere";
      fe_->metrics->Retried();
      return Attempt();
    }
  }
  if (Retryable(status) && relayed) {
    return End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("the worker failed after ", tokens,
                                         " tokens: ", status.error_message())),
               "unavailable");
  }
  End(status, CodeLabel(FromGrpcStatus(status).code()));
}

void GenerateCall::OnCancel() {
  std::unique_lock<std::mutex> lock(mu_);
  cancelled_ = true;
  const bool queued = !admitted_ && ticket_ != 0;
  const uint64_t ticket = ticket_;
  lock.unlock();
  // A queued call ends here; a running one ends when its (cancelled) upstream reports.
  if (queued && fe_->admission->Withdraw(ticket)) {
    const bool deadline = DeadlinePassed(context_->deadline());
    End(grpc::Status(deadline ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::CANCELLED,
                     "ended while queued"),
        deadline ? "deadline_exceeded" : "cancelled");
  }
}

void GenerateCall::EndCut() {
  const double now = base::NowSeconds();
  moe::v1::GenerateResponse last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last.set_request_id(request_.request_id());
    moe::v1::Completion* c = last.mutable_completion();
    c->set_finish_reason(moe::v1::FINISH_REASON_CANCELLED);
    // The prompt's token count is the worker's to know; the frontend knows what it relayed.
    c->mutable_usage()->set_completion_tokens(static_cast<uint64_t>(tokens_sent_));
    moe::v1::Timings* t = c->mutable_timings();
    t->set_queue_seconds((admitted_at_ > 0 ? admitted_at_ : now) - arrival_);
    if (first_token_at_ > 0) t->set_time_to_first_token_seconds(first_token_at_ - arrival_);
    t->set_total_seconds(now - arrival_);
    c->set_worker(worker_name_);
  }
  End(grpc::Status::OK, "cancelled", &last);
}

void GenerateCall::End(const grpc::Status& status, const std::string& outcome,
                       const moe::v1::GenerateResponse* last) {
  bool leave = false;
  double admitted_at = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = true;
    leave = admitted_;
    admitted_at = admitted_at_;
    if (last != nullptr) {
      // No write is in flight when a call ends: out_bytes_ is free.
      bool own = false;
      out_bytes_.Clear();
      if (!grpc::SerializationTraits<moe::v1::GenerateResponse>::Serialize(*last, &out_bytes_,
                                                                           &own)
               .ok()) {
        last = nullptr;  // cannot happen for a message we built; end with the status alone
      }
    }
  }
  fe_->metrics->RequestFinished(outcome);
  if (status.ok()) fe_->metrics->ObserveE2e(base::NowSeconds() - arrival_);
  if (admitted_at > 0) fe_->metrics->ObserveQueue(admitted_at - arrival_);
  if (leave) fe_->admission->Leave();
  if (last != nullptr) {
    StartWriteAndFinish(&out_bytes_, grpc::WriteOptions(), status);
  } else {
    Finish(status);
  }
}

void GenerateCall::OnDone() {
  {
    std::lock_guard<std::mutex> lock(fe_->calls_mu);
    fe_->calls.erase(this);
  }
  std::unique_lock<std::mutex> lock(mu_);
  server_done_ = true;
  MaybeDelete(lock);
}

void GenerateCall::MaybeDelete(std::unique_lock<std::mutex>& lock) {
  if (!server_done_ || upstream_ != nullptr) return;
  lock.unlock();
  delete this;
}

}  // namespace moe::service
