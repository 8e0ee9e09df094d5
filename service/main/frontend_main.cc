// moe-frontend: the public moe.v1 gRPC API. Validates, admits into a bounded queue, routes to
// moe-worker processes (static list or DNS), relays token streams; health, reflection and
// /metrics; with --http_listen, the OpenAI/Anthropic HTTP API (service/http/) over the same
// calls. SIGTERM drains: refuse new calls, let running ones finish within --drain_seconds.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "service/frontend/admission.h"
#include "service/frontend/frontend_service.h"
#include "service/frontend/router.h"
#include "service/frontend/worker_set.h"
#include "service/http/http_server.h"
#include "service/main/signals.h"
#include "service/metrics/frontend_metrics.h"
#include "service/security.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address of the public API");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9451",
          "HTTP address of /metrics (port 0: any). Loopback by default: give 0.0.0.0:9451 where "
          "Prometheus scrapes from another host");
ABSL_FLAG(std::vector<std::string>, workers, {}, "Comma-separated worker addresses (host:port)");
ABSL_FLAG(std::string, workers_dns, "",
          "host:port whose every DNS address is a worker (a Kubernetes headless Service); "
          "re-resolved every --dns_refresh_seconds");
ABSL_FLAG(double, dns_refresh_seconds, 5, "How often --workers_dns is resolved again");
ABSL_FLAG(double, health_seconds, 1, "How often every worker's health and load are polled");
ABSL_FLAG(int32_t, health_failures, 3,
          "Polls in a row a worker must fail to be marked down (one good poll brings it back)");
ABSL_FLAG(int64_t, max_running, 256, "Calls relayed to workers at once");
ABSL_FLAG(int64_t, max_queued, 1024,
          "Calls waiting for a slot; beyond it calls get RESOURCE_EXHAUSTED at once");
ABSL_FLAG(int32_t, max_attempts, 3, "Workers tried for a call before its first token");
ABSL_FLAG(int64_t, max_request_bytes, 4 << 20,
          "Largest request message; larger ones get RESOURCE_EXHAUSTED, counted in "
          "moe_frontend_oversized_requests_total (gRPC drops past twice this, uncounted). "
          "Larger HTTP API bodies get 413");
ABSL_FLAG(std::string, auth_token, "",
          "If set, public calls need 'authorization: Bearer <token>' (health and reflection "
          "stay open for probes and tools)");
ABSL_FLAG(std::string, auth_token_file, "",
          "Read --auth_token from this file instead; an empty file is an error, never auth off");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert");
ABSL_FLAG(std::string, worker_token_file, "",
          "Bearer token sent to the workers (their --auth_token_file); empty: none");
ABSL_FLAG(std::string, worker_tls_ca, "",
          "PEM CA certificate that signed the workers' --tls_cert: talk TLS to them. Empty: "
          "plaintext");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "With --worker_tls_ca: the name the workers' certificate carries, when workers are "
          "addressed by IP (--workers_dns)");
ABSL_FLAG(bool, prefix_routing, true,
          "Route a request without a known session to the worker that was sent the longest "
          "prefix of its prompt (its KV cache likely holds it), unless that worker has more than "
          "--prefix_load_slack outstanding tokens over the least loaded one. false: least loaded");
ABSL_FLAG(int64_t, prefix_entries, 16384,
          "Prompt chunks remembered per worker for --prefix_routing (LRU); about the workers' KV "
          "capacity in blocks");
ABSL_FLAG(int32_t, prefix_chunk_tokens, 16,
          "Token ids per remembered prompt chunk (text and chat: 4x as many bytes); match the "
          "workers' --kv_block_size");
ABSL_FLAG(int64_t, prefix_load_slack, 2048,
          "Outstanding tokens the prefix worker may have above the least loaded worker and still "
          "be picked");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT of the OpenAI- and Anthropic-compatible HTTP API (/v1/chat/completions, "
          "/v1/completions, /v1/models, /v1/messages); empty: off. Served with the same "
          "--tls_cert/--tls_key and --auth_token (as 'Authorization: Bearer' or 'x-api-key') "
          "as the gRPC API");
ABSL_FLAG(int32_t, http_threads, 256,
          "HTTP connections served at once (each open stream holds one); more wait");
ABSL_FLAG(double, drain_seconds, 30, "On SIGTERM, how long running calls may take to finish");

namespace moe {
namespace {

absl::Status Run() {
  service::WorkerSetOptions wopts;
  wopts.static_targets = absl::GetFlag(FLAGS_workers);
  wopts.dns_target = absl::GetFlag(FLAGS_workers_dns);
  wopts.poll_seconds = absl::GetFlag(FLAGS_health_seconds);
  wopts.poll_timeout_seconds = std::max(0.2, wopts.poll_seconds);
  wopts.dns_refresh_seconds = absl::GetFlag(FLAGS_dns_refresh_seconds);
  wopts.channel.down_after_failed_polls = absl::GetFlag(FLAGS_health_failures);
  if (const std::string path = absl::GetFlag(FLAGS_worker_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = service::ReadTokenFile(path);
    if (!token.ok()) return base::Annotate(token.status(), "--worker_token_file");
    wopts.channel.token = *token;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials =
      service::ChannelCredentialsFromFile(absl::GetFlag(FLAGS_worker_tls_ca));
  if (!worker_credentials.ok()) {
    return base::Annotate(worker_credentials.status(), "--worker_tls_ca");
  }
  wopts.channel.credentials = *worker_credentials;
  wopts.channel.tls_server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  MOE_RETURN_IF_ERROR(base::Annotate(wopts.Validate(), "--workers/--workers_dns"));
  service::AdmissionOptions aopts{absl::GetFlag(FLAGS_max_running),
                                  absl::GetFlag(FLAGS_max_queued)};
  MOE_RETURN_IF_ERROR(base::Annotate(aopts.Validate(), "--max_running/--max_queued"));
  service::FrontendOptions fopts;
  fopts.auth_token = absl::GetFlag(FLAGS_auth_token);
  if (!absl::GetFlag(FLAGS_auth_token_file).empty()) {
    // Fail closed: a file that holds no token is a broken secret, not a request for no auth.
    absl::StatusOr<std::string> token =
        service::ReadTokenFile(absl::GetFlag(FLAGS_auth_token_file));
    if (!token.ok()) return base::Annotate(token.status(), "--auth_token_file");
    fopts.auth_token = *token;
  }
  fopts.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  fopts.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (fopts.max_request_bytes < 1) {
    return absl::InvalidArgumentError("--max_request_bytes must be >= 1");
  }
  if (fopts.max_attempts < 1) return absl::InvalidArgumentError("--max_attempts must be >= 1");
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      service::ServerCredentialsFromFiles(absl::GetFlag(FLAGS_tls_cert),
                                          absl::GetFlag(FLAGS_tls_key));
  if (!credentials.ok()) return base::Annotate(credentials.status(), "--tls_cert/--tls_key");
  service::RouterOptions ropts;
  ropts.prefix_routing = absl::GetFlag(FLAGS_prefix_routing);
  ropts.prefix_entries =
      static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_prefix_entries)));
  ropts.prefix_chunk_tokens = absl::GetFlag(FLAGS_prefix_chunk_tokens);
  ropts.prefix_load_slack = absl::GetFlag(FLAGS_prefix_load_slack);
  MOE_RETURN_IF_ERROR(base::Annotate(ropts.Validate(), "--prefix_*"));

  auto registry = std::make_shared<prometheus::Registry>();
  service::metrics::FrontendMetrics metrics(*registry);
  MOE_ASSIGN_OR_RETURN(auto metrics_server, service::metrics::MetricsServer::Start(
                                                absl::GetFlag(FLAGS_metrics_listen), registry));

  // The health service exists only once the server is built; polls before that skip it.
  std::atomic<grpc::HealthCheckServiceInterface*> health{nullptr};
  service::FrontendService* svc_ptr = nullptr;
  std::atomic<bool> svc_ready{false};
  service::WorkerSet workers(wopts, [&](int64_t up, int64_t down) {
    metrics.SetWorkers(up, down);
    if (svc_ready.load()) svc_ptr->UpdateHealth(health.load());
  });
  service::Router router(workers, ropts);
  service::Admission admission(
      aopts, [&](int64_t running, int64_t queued) { metrics.SetAdmission(running, queued); });
  service::FrontendService svc(fopts, workers, router, admission, metrics);
  svc_ptr = &svc;
  svc_ready = true;
  workers.Start();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &port);
  service::RefusePortReuse(builder);
  builder.RegisterService(&svc);
  // The service refuses (and counts) requests over --max_request_bytes itself; gRPC refuses a
  // message only past twice that, uncounted (the call never reaches the service).
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(2 * absl::GetFlag(FLAGS_max_request_bytes), INT32_MAX)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen),
                                               " (in use, or not an address of this host)"));
  }
  health = server->GetHealthCheckService();
  svc.UpdateHealth(health.load());
  MOE_LOG(INFO) << "[frontend] serving moe.v1 on port " << port << ", /metrics on port "
                << metrics_server->port() << ", " << workers.Snapshot().size() << " workers";
  // The HTTP API calls this server in-process: same admission, routing, metrics and auth.
  std::unique_ptr<service::http::HttpServer> http;
  if (const std::string listen = absl::GetFlag(FLAGS_http_listen); !listen.empty()) {
    service::http::HttpOptions hopts;
    hopts.listen = listen;
    hopts.tls_cert = absl::GetFlag(FLAGS_tls_cert);
    hopts.tls_key = absl::GetFlag(FLAGS_tls_key);
    hopts.auth_token = fopts.auth_token;
    hopts.threads = absl::GetFlag(FLAGS_http_threads);
    hopts.max_body_bytes = static_cast<size_t>(fopts.max_request_bytes);
    auto started = service::http::HttpServer::Start(
        hopts, server->InProcessChannel(grpc::ChannelArguments()), metrics);
    if (!started.ok()) return base::Annotate(started.status(), "--http_listen");
    http = std::move(*started);
    MOE_LOG(INFO) << "[frontend] serving the HTTP API on port " << http->port();
  }

  const int sig = service::WaitForTerminationSignal();
  MOE_LOG(INFO) << "[frontend] signal " << sig << ": draining for up to "
                << absl::GetFlag(FLAGS_drain_seconds) << " s, " << admission.running()
                << " running";
  svc.StartDrain();
  svc.UpdateHealth(health.load());
  const double deadline = base::NowSeconds() + absl::GetFlag(FLAGS_drain_seconds);
  while ((admission.running() > 0 || admission.queued() > 0) && base::NowSeconds() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The poll thread updates the server's health service: stop it before the server goes.
  workers.Stop();
  // Calls still running end as a worker's drain ends its streams (FINISH_REASON_CANCELLED,
  // status OK); Shutdown's second lets their last messages out, then cancels what is left.
  if (admission.running() > 0 || admission.queued() > 0) {
    MOE_LOG(WARNING) << "[frontend] drain time is up: cutting " << admission.running()
                     << " running and " << admission.queued() << " queued calls";
  }
  svc.CutRunning();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // After the server: its shutdown ends the in-process calls that HTTP streams wait on.
  if (http != nullptr) http->Stop();
  MOE_LOG(INFO) << "[frontend] stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::service::BlockTerminationSignals();
  moe::base::ParseFlags(argc, argv,
      "Serves the public moe.v1 gRPC API in front of moe-worker processes.\n"
      "  moe-frontend --workers=127.0.0.1:50061,127.0.0.1:50062 --listen=0.0.0.0:50051",
      __FILE__);
  const absl::Status status = moe::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "moe-frontend: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  return 0;
}
