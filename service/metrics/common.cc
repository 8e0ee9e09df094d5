// The one-series builders and the /metrics server both processes use.
#include "service/metrics/common.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moe::service::metrics {

prometheus::Histogram* Hist(prometheus::Registry& r, const std::string& name,
                            const std::string& help,
                            const prometheus::Histogram::BucketBoundaries& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, buckets);
}
prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  try {
    // civetweb serves one connection per thread and waits up to request_timeout_ms for a
    // connection's request: with its defaults (prometheus-cpp's 2 threads, 30 s), two idle TCP
    // connections blocked every scrape for 30 s. Enough threads for a few stray connections,
    // and a short wait for each (a scrape sends its request at once).
    server->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "8", "request_timeout_ms", "2000",
        "enable_keep_alive", "no"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot listen on ", address, ": ", e.what()));
  }
  server->registry_ = std::move(registry);
  server->exposer_->RegisterCollectable(server->registry_, "/metrics");
  std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  return server;
}

}  // namespace moe::service::metrics
