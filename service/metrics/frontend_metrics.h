// The frontend's metrics: the client's view under moe_frontend_ (so summing across jobs never
// counts a request twice). Names, help and labels live in frontend_metrics.cc only.
// All methods are thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>

#include "absl/strings/string_view.h"
#include "service/metrics/common.h"

namespace moe::service::metrics {

class FrontendMetrics {
 public:
  explicit FrontendMetrics(prometheus::Registry& registry);

  void RequestFinished(absl::string_view outcome);
  void ObserveQueue(double seconds) { queue_->Observe(seconds); }
  void ObserveTtft(double seconds) { ttft_->Observe(seconds); }
  void ObserveItl(double seconds) { itl_->Observe(seconds); }
  void ObserveE2e(double seconds) { e2e_->Observe(seconds); }
  void SetAdmission(int64_t running, int64_t queued);
  void SetWorkers(int64_t up, int64_t down);
  void Retried() { retries_->Increment(); }
  // A worker ended a Generate attempt with an error status (`code`: its CodeLabel).
  void WorkerFailed(absl::string_view code);
  // A call refused as over --max_request_bytes; `method`: Generate, Tokenize, ...
  void Oversized(absl::string_view method);
  // A worker picked for a Generate attempt; `reason`: session, prefix or least_load.
  void Routed(absl::string_view reason);
  // An HTTP API request answered (--http_listen); `api`: chat_completions, completions, models
  // or messages; `code`: the HTTP status (200 for a stream, whatever happened after).
  void HttpRequest(absl::string_view api, int code);

 private:
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Histogram *queue_, *ttft_, *itl_, *e2e_;
  prometheus::Gauge *running_, *queued_, *workers_up_, *workers_down_;
  prometheus::Counter* retries_;
  prometheus::Family<prometheus::Counter>* routed_;
  prometheus::Family<prometheus::Counter>* worker_failures_;
  prometheus::Family<prometheus::Counter>* oversized_;
  prometheus::Family<prometheus::Counter>* http_requests_;
};

}  // namespace moe::service::metrics
