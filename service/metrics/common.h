// What the frontend's and the worker's metrics share: vLLM's histogram buckets, the one-series
// builders, and the /metrics HTTP server. The names, help texts and labels live in
// frontend_metrics.cc and worker_metrics.cc only. Prefix moe_, promtool-clean.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace moe::service::metrics {

// vLLM's buckets (vllm/v1/metrics/loggers.py): time_to_first_token_seconds,
// time_per_output_token_seconds, and e2e_request_latency_seconds (also its queue time), so its
// dashboards carry over.
inline const prometheus::Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
inline const prometheus::Histogram::BucketBoundaries kItlBuckets = {
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
inline const prometheus::Histogram::BucketBoundaries kRequestBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// A family of one unlabelled series, registered in `r`. tests/deploy/queries.py reads metric
// names from calls of these three by their names: keep them.
prometheus::Histogram* Hist(prometheus::Registry& r, const std::string& name,
                            const std::string& help,
                            const prometheus::Histogram::BucketBoundaries& buckets);
prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help);
prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help);

// Serves a registry as /metrics over HTTP (prometheus-cpp's civetweb).
class MetricsServer {
 public:
  // `address` is host:port; port 0 picks a free one. Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  int port() const { return port_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

}  // namespace moe::service::metrics
