// GenerateStream: engine events -> WorkerGenerateResponse messages, one write in flight.
#include "service/worker/generate_stream.h"

#include "kernels/base/clock.h"
#include "service/status_convert.h"

namespace moe::service {
namespace {

moe::v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return moe::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return moe::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kCancelled:
      return moe::v1::FINISH_REASON_CANCELLED;
    case engine::FinishReason::kError:
      return moe::v1::FINISH_REASON_ERROR;
    case engine::FinishReason::kNone:
      break;
  }
  return moe::v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace

std::shared_ptr<GenerateStream> GenerateStream::Create(Context context, EngineLoop& loop,
                                                       metrics::WorkerMetrics& metrics) {
  std::shared_ptr<GenerateStream> s(new GenerateStream(std::move(context), loop, metrics));
  s->self_ = s;
  return s;
}

GenerateStream::GenerateStream(Context context, EngineLoop& loop, metrics::WorkerMetrics& metrics)
    : ctx_(std::move(context)), loop_(loop), metrics_(metrics), start_(base::NowSeconds()) {}

void GenerateStream::Reject(const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    finish_called_ = true;
  }
  Finish(status);
}

void GenerateStream::SetPromptOpensThinking() {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_opens_thinking_ = true;
}

void GenerateStream::OnEvent(engine::Event event) {
  const double now = base::NowSeconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (event.token) {
      if (first_token_at_ == 0) {
        first_token_at_ = now;
        queue_seconds_ = event.queue_seconds;
        metrics_.ObserveQueue(event.queue_seconds);
        metrics_.ObserveTtft(now - start_);
      } else {
        metrics_.ObserveItl(now - last_token_at_);
      }
      last_token_at_ = now;
    }
    // A cancel says nothing about the worker's health, so it neither counts as a fault nor ends
    // a run of faults (--max_consecutive_faults).
    if (event.finish != engine::FinishReason::kNone && ctx_.readiness != nullptr &&
        event.finish != engine::FinishReason::kCancelled) {
      ctx_.readiness->RequestEnded(event.finish == engine::FinishReason::kError ? event.error
                                                                                : absl::OkStatus());
    }
    if (event.finish != engine::FinishReason::kNone) {
      const bool refused = event.finish == engine::FinishReason::kError && first_token_at_ == 0 &&
                           event.usage.completion_tokens == 0;
      const bool timed_out =
          event.finish == engine::FinishReason::kCancelled && deadline_exceeded_;
      metrics_.RequestFinished(
          refused     ? CodeLabel(event.error.code())
          : timed_out ? "deadline_exceeded"
                      : engine::FinishReasonName(event.finish),
          event.usage.prompt_tokens, event.usage.cached_prompt_tokens,
          event.usage.completion_tokens);
      if (!refused) metrics_.ObserveE2e(now - start_);
      if (refused) {
        // Nothing was generated: the status alone says it (INVALID_ARGUMENT, ...).
        final_status_ = ToGrpcStatus(event.error);
      } else {
        final_status_ = event.finish == engine::FinishReason::kError ? ToGrpcStatus(event.error)
                                                                     : grpc::Status::OK;
        pending_.push_back(std::move(event));
      }
    } else {
      pending_.push_back(std::move(event));
    }
  }
  Pump();
}

void GenerateStream::Fill(moe::v1::GenerateResponse* out) {
  out->Clear();
  out->set_request_id(ctx_.client_request_id);
  if (prompt_opens_thinking_) {
    out->set_prompt_opens_thinking(true);
    prompt_opens_thinking_ = false;
  }
  const double now = base::NowSeconds();
  for (engine::Event& e : pending_) {
    out->mutable_text()->append(e.text);
    if (e.token) {
      out->add_token_ids(static_cast<uint32_t>(*e.token));
      if (ctx_.logprobs) {
        moe::v1::TokenLogprob* lp = out->add_logprobs();
        lp->set_logprob(e.logprobs.logprob);
        for (const auto& [id, logprob] : e.logprobs.top) {
          moe::v1::TopLogprob* top = lp->add_top();
          top->set_token_id(static_cast<uint32_t>(id));
          top->set_logprob(logprob);
        }
      }
    }
    if (e.finish != engine::FinishReason::kNone) {
      moe::v1::Completion* c = out->mutable_completion();
      c->set_finish_reason(ToProto(e.finish));
      c->mutable_usage()->set_prompt_tokens(e.usage.prompt_tokens);
      c->mutable_usage()->set_cached_prompt_tokens(e.usage.cached_prompt_tokens);
      c->mutable_usage()->set_completion_tokens(e.usage.completion_tokens);
      // Times run from arrival at the frontend: its share was measured there and passed on.
      moe::v1::Timings* t = c->mutable_timings();
      t->set_queue_seconds(ctx_.frontend_queue_seconds + queue_seconds_);
      if (first_token_at_ > 0) {
        t->set_time_to_first_token_seconds(ctx_.frontend_elapsed_seconds + first_token_at_ -
                                           start_);
      }
      t->set_total_seconds(ctx_.frontend_elapsed_seconds + now - start_);
      if (!e.error.ok() && e.finish == engine::FinishReason::kError) {
        c->set_error(std::string(e.error.message()));
      }
      c->set_worker(ctx_.worker_name);
    }
  }
  pending_.clear();
}

// One write in flight at a time (a reactor allows no more); events that arrive meanwhile are
// folded into the next message, so a slow client costs fewer, larger messages, never engine time:
// OnEvent runs on the engine thread and only appends.
void GenerateStream::Pump() {
  std::unique_lock<std::mutex> lock(mu_);
  if (writing_ || finish_called_) return;
  if (cancelled_) {
    finish_called_ = true;
    lock.unlock();
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    return;
  }
  if (pending_.empty()) {
    if (final_status_) {
      finish_called_ = true;
      grpc::Status status = *final_status_;
      lock.unlock();
      Finish(status);
    }
    return;
  }
  Fill(msg_.mutable_response());
  writing_ = true;
  lock.unlock();
  StartWrite(&msg_);
}

void GenerateStream::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) cancelled_ = true;  // the client went away
  }
  Pump();
}

void GenerateStream::OnCancel() {
  // Before the engine hears of it: its final kCancelled event reads the flag.
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    deadline_exceeded_ = DeadlinePassed(ctx_.deadline);
  }
  loop_.Cancel(ctx_.engine_id);
  Pump();
}

void GenerateStream::OnDone() {
  // The engine loop may still hold a reference until the request's final event.
  std::shared_ptr<GenerateStream> keep = std::move(self_);
}

}  // namespace moe::service
