// The names, help texts and labels of the frontend's metrics.
#include "service/metrics/frontend_metrics.h"

#include <string>

namespace moe::service::metrics {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

FrontendMetrics::FrontendMetrics(prometheus::Registry& r) {
  requests_ = &BuildCounter()
                   .Name("moe_frontend_requests_total")
                   .Help(
                       "Generate calls answered, by outcome (stop, length, cancelled, error, "
                       "or the status code: invalid_argument, resource_exhausted, ...)")
                   .Register(r);
  queue_ = Hist(r, "moe_frontend_request_queue_time_seconds",
                "Seconds a request waited in the admission queue", kRequestBuckets);
  ttft_ =
      Hist(r, "moe_frontend_time_to_first_token_seconds",
           "Seconds from a call's arrival to its first token, as the client sees it", kTtftBuckets);
  itl_ = Hist(r, "moe_frontend_inter_token_latency_seconds",
              "Seconds between consecutive tokens relayed to a client", kItlBuckets);
  e2e_ = Hist(r, "moe_frontend_e2e_request_latency_seconds",
              "Seconds from a call's arrival to its last message", kRequestBuckets);
  running_ = Gauge(r, "moe_frontend_requests_running", "Calls relayed to a worker now");
  queued_ = Gauge(r, "moe_frontend_requests_queued", "Calls waiting in the admission queue");
  auto& workers = BuildGauge()
                      .Name("moe_frontend_workers")
                      .Help("Known workers by state (up: healthy and serving; down)")
                      .Register(r);
  workers_up_ = &workers.Add({{"state", "up"}});
  workers_down_ = &workers.Add({{"state", "down"}});
  retries_ = Counter(r, "moe_frontend_retries_total",
                     "Calls retried on another worker after one failed before the first token");
  worker_failures_ = &BuildCounter()
                         .Name("moe_frontend_worker_failures_total")
                         .Help(
                             "Generate attempts that failed on the worker's side, by code "
                             "(unavailable, data_loss, internal, unknown), retried or not")
                         .Register(r);
  oversized_ = &BuildCounter()
                    .Name("moe_frontend_oversized_requests_total")
                    .Help("Calls refused as over --max_request_bytes, by method")
                    .Register(r);
  routed_ = &BuildCounter()
                 .Name("moe_frontend_routing_decisions_total")
                 .Help(
                     "Workers picked for Generate attempts, by the rule that decided (session: "
                     "the session's worker; prefix: the longest remembered prompt prefix; "
                     "least_load: the fewest outstanding tokens)")
                 .Register(r);
  http_requests_ = &BuildCounter()
                        .Name("moe_http_requests_total")
                        .Help(
                            "HTTP API requests answered (--http_listen), by api "
                            "(chat_completions, completions, models, messages) and HTTP status "
                            "code (a stream counts 200 even when an error ends it later)")
                        .Register(r);
  for (const char* reason : {"session", "prefix", "least_load"}) routed_->Add({{"reason", reason}});
  for (const char* outcome : {"stop", "length", "cancelled", "error", "resource_exhausted",
                              "unavailable", "invalid_argument", "deadline_exceeded"}) {
    requests_->Add({{"outcome", outcome}});
  }
}

void FrontendMetrics::RequestFinished(absl::string_view outcome) {
  requests_->Add({{"outcome", std::string(outcome)}}).Increment();
}

void FrontendMetrics::WorkerFailed(absl::string_view code) {
  worker_failures_->Add({{"code", std::string(code)}}).Increment();
}

void FrontendMetrics::Oversized(absl::string_view method) {
  oversized_->Add({{"method", std::string(method)}}).Increment();
}

void FrontendMetrics::Routed(absl::string_view reason) {
  routed_->Add({{"reason", std::string(reason)}}).Increment();
}

void FrontendMetrics::HttpRequest(absl::string_view api, int code) {
  http_requests_->Add({{"api", std::string(api)}, {"code", std::to_string(code)}}).Increment();
}

void FrontendMetrics::SetAdmission(int64_t running, int64_t queued) {
  running_->Set(static_cast<double>(running));
  queued_->Set(static_cast<double>(queued));
}

void FrontendMetrics::SetWorkers(int64_t up, int64_t down) {
  workers_up_->Set(static_cast<double>(up));
  workers_down_->Set(static_cast<double>(down));
}

}  // namespace moe::service::metrics
