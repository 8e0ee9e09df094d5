// moe-worker: serves one model on the CPU or one GPU through the internal worker API, with
// grpc.health.v1 and /metrics. SIGTERM drains: stop admitting, let running streams finish
// within --drain_seconds, cancel the rest, exit.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/default_model.h"
#include "nlohmann/json.hpp"
#include "engine/engine.h"
#include "expertstore/expert_store.h"
#include "expertstore/manifest.h"
#include "kernels/base/bytes.h"
#include "kernels/base/clock.h"
#include "kernels/base/flags.h"
#include "kernels/base/log.h"
#include "kernels/base/status.h"
#include "service/main/model_flags.h"
#include "service/main/signals.h"
#include "service/metrics/worker_metrics.h"
#include "service/security.h"
#include "service/worker/engine_loop.h"
#include "service/worker/worker_service.h"

ABSL_FLAG(std::string, model_name, "",
          "The name requests use for the model. Default: a model store's name (moe-import "
          "--model), else the directory's base name");
ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "gRPC address of the worker API and health. Loopback by default: the worker API is "
          "for the frontend only (give 0.0.0.0:50061 with --auth_token_file where the frontend "
          "runs on another host)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9461",
          "HTTP address of /metrics (port 0: any). Loopback by default: give 0.0.0.0:9461 where "
          "Prometheus scrapes from another host");
ABSL_FLAG(std::string, auth_token_file, "",
          "If set, worker API calls need 'authorization: Bearer <token>' with the token in this "
          "file (the frontend's --worker_token_file); an empty file is an error. Health and "
          "reflection stay open for probes");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert");
ABSL_FLAG(int32_t, max_consecutive_faults, 5,
          "Requests in a row failing on the worker itself (DATA_LOSS, INTERNAL: e.g. a corrupt "
          "expert store) after which it reports NOT_SERVING, with the reason, until restarted");
ABSL_FLAG(std::string, name, "", "Name reported in responses and logs. Default: --listen");
ABSL_FLAG(int64_t, max_running, 0,
          "Sequences in the running batch; 0: 256 on a GPU (decode steps big enough for the "
          "tensor cores), 64 on the CPU");
ABSL_FLAG(int64_t, max_batch_tokens, 0,
          "Tokens per engine step (prefill chunks + decodes); 0: 2048 on a GPU, 256 on the CPU");
ABSL_FLAG(int64_t, max_context, 0, "Context length; 0: the model's max_position_embeddings");
ABSL_FLAG(int64_t, max_sessions, 64, "Conversations whose KV is kept between turns");
ABSL_FLAG(double, drain_seconds, 30, "On SIGTERM, how long running streams may take to finish");

namespace moe {
namespace {

// GetModel's expert_format (moe.v1 ModelInfo): the format the experts run in. A store (its
// manifest given): the manifest's expert_format, with "-g<group_size>" when quantized
// ("int4-g64", "bf16"). A checkpoint: its config.json dtype ("bf16", "f16", "f32"; another value
// as it is written).
absl::StatusOr<std::string> ExpertFormat(const std::string& dir,
                                         const store::StoreManifest* manifest) {
  if (manifest != nullptr) {
    std::string format = manifest->expert_format;
    if (manifest->group_size > 0) absl::StrAppend(&format, "-g", manifest->group_size);
    return format;
  }
  const std::filesystem::path path = std::filesystem::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::DataLossError(absl::StrCat(path.string(), ": not JSON"));
  auto text = [&j](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  // Hugging Face writes torch_dtype (newer releases: dtype); the experts are read as stored.
  std::string dtype = text("torch_dtype");
  if (dtype.empty()) dtype = text("dtype");
  if (dtype == "bfloat16") return std::string("bf16");
  if (dtype == "float16") return std::string("f16");
  if (dtype == "float32") return std::string("f32");
  return dtype.empty() ? std::string("unknown") : dtype;
}

absl::Status Run() {
  // Shared with moe-generate (service/main/model_flags.h): backend, budgets, model, tokenizer.
  MOE_ASSIGN_OR_RETURN(service::LoadedModel loaded, service::LoadModelFromFlags("[worker]"));
  const std::string& dir = loaded.dir;
  engine::Model* model = loaded.model.get();
  engine::Tokenizer* tokenizer = loaded.tokenizer.get();
  // When --model is a model store (moe-import), experts come from the tiered store; its
  // counters then feed /metrics.
  const store::ExpertStore* store = model->expert_store();
  // Declared before the engine loop, so it outlives every step that appends to it.
  std::unique_ptr<store::RoutingTraceWriter>& trace = loaded.trace;

  engine::EngineOptions eopts;
  eopts.kv_budget_bytes = loaded.kv_budget;
  eopts.max_running = absl::GetFlag(FLAGS_max_running);
  if (eopts.max_running == 0) eopts.max_running = loaded.gpu ? 256 : 64;
  eopts.kv_cache_dtype = loaded.kv_cache_dtype;
  eopts.block_size = loaded.kv_block_size;
  eopts.state_snapshot_blocks = loaded.state_snapshot_blocks;
  eopts.kv_tail_tokens = loaded.kv_tail_tokens;
  eopts.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  if (eopts.max_batch_tokens == 0) eopts.max_batch_tokens = loaded.gpu ? 2048 : 256;
  eopts.max_context = absl::GetFlag(FLAGS_max_context);
  eopts.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  MOE_RETURN_IF_ERROR(base::Annotate(eopts.Validate(), "engine flags"));
  // A worker whose KV budget holds no block could serve nothing: it does not start.
  MOE_ASSIGN_OR_RETURN(auto engine, engine::Engine::Create(*model, *tokenizer, eopts));
  engine::Engine& eng = *engine;

  // A store's manifest.json: its model name and expert format.
  std::optional<store::StoreManifest> manifest;
  if (store != nullptr) {
    MOE_ASSIGN_OR_RETURN(manifest, store::ReadManifest(dir));
  }

  service::WorkerOptions wopts;
  wopts.model_name = absl::GetFlag(FLAGS_model_name);
  if (wopts.model_name.empty() && manifest.has_value()) {
    // A store is served under the name moe-import --model gave it (its manifest's "model").
    wopts.model_name = manifest->model;
  }
  if (wopts.model_name.empty()) {
    wopts.model_name = std::filesystem::path(dir).lexically_normal().filename().string();
    if (wopts.model_name.empty()) {
      wopts.model_name = std::filesystem::path(dir).lexically_normal().parent_path().filename();
    }
  }
  wopts.name =
      absl::GetFlag(FLAGS_name).empty() ? absl::GetFlag(FLAGS_listen) : absl::GetFlag(FLAGS_name);
  wopts.context_length =
      eopts.max_context > 0 ? eopts.max_context : model->config().max_position_embeddings;
  wopts.max_running = eopts.max_running;
  wopts.kv_budget_bytes = eopts.kv_budget_bytes;
  MOE_ASSIGN_OR_RETURN(wopts.expert_format,
                       ExpertFormat(dir, manifest.has_value() ? &*manifest : nullptr));
  wopts.kv_cache_format = eopts.kv_cache_dtype;
  wopts.device_budget_bytes = loaded.device_budget;
  wopts.host_budget_bytes = loaded.host_budget;
  wopts.max_consecutive_faults = absl::GetFlag(FLAGS_max_consecutive_faults);
  if (wopts.max_consecutive_faults < 1) {
    return absl::InvalidArgumentError("--max_consecutive_faults must be >= 1");
  }
  if (const std::string path = absl::GetFlag(FLAGS_auth_token_file); !path.empty()) {
    // Fail closed: a file that holds no token is a broken secret, not a request for no auth.
    absl::StatusOr<std::string> token = service::ReadTokenFile(path);
    if (!token.ok()) return base::Annotate(token.status(), "--auth_token_file");
    wopts.auth_token = *token;
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      service::ServerCredentialsFromFiles(absl::GetFlag(FLAGS_tls_cert),
                                          absl::GetFlag(FLAGS_tls_key));
  if (!credentials.ok()) return base::Annotate(credentials.status(), "--tls_cert/--tls_key");

  auto registry = std::make_shared<prometheus::Registry>();
  service::metrics::WorkerMetrics metrics(*registry);
  MOE_ASSIGN_OR_RETURN(auto metrics_server, service::metrics::MetricsServer::Start(
                                                absl::GetFlag(FLAGS_metrics_listen), registry));
  const engine::Model& model_ref = *model;
  service::EngineLoop loop(eng, [&](const engine::EngineStats& s, int64_t steps) {
    metrics.SetEngine({s.running, s.waiting, s.kv_bytes_used, s.kv_bytes_budget,
                       s.kv_bytes_per_token, s.sessions, s.state_bytes_used, s.state_bytes_budget,
                       s.state_slots_total, s.state_slots_used, s.state_snapshots,
                       s.state_snapshot_hits});
    // Read on the engine thread, which is the only one running the model.
    metrics.SetPhaseTimes(model_ref.phase_times(), steps);
    if (store != nullptr)
      metrics.UpdateExpertStore(service::metrics::FromStoreStats(store->Stats()));
    // The engine thread is the trace's only writer.
    if (trace != nullptr) {
      if (absl::Status st = trace->Flush(); !st.ok()) {
        MOE_LOG(ERROR) << "[worker] " << st;
      }
    }
  });
  service::WorkerService svc(wopts, *model, *tokenizer, loop, metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &port);
  service::RefusePortReuse(builder);
  builder.RegisterService(&svc);
  builder.SetMaxReceiveMessageSize(64 << 20);  // the frontend enforces the public limit
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen),
                                               " (in use, or not an address of this host)"));
  }
  // Kubernetes probes name a service: "liveness" serves as long as the process runs (a drain
  // must not get it killed), "readiness" drops when the drain starts or the worker keeps
  // failing requests (WorkerService, Readiness).
  svc.SetHealth(server->GetHealthCheckService());
  MOE_LOG(INFO) << "[worker] " << wopts.name << " serving model '" << wopts.model_name << "' ("
                << model->config().arch.model_type << ", context " << wopts.context_length
                << ") on port " << port << ", /metrics on port " << metrics_server->port();

  const int sig = service::WaitForTerminationSignal();
  MOE_LOG(INFO) << "[worker] signal " << sig << ": draining for up to "
                << absl::GetFlag(FLAGS_drain_seconds) << " s, " << loop.live() << " live";
  svc.StartDrain();
  const double deadline = base::NowSeconds() + absl::GetFlag(FLAGS_drain_seconds);
  while (loop.live() > 0 && base::NowSeconds() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (loop.live() > 0) {
    MOE_LOG(WARNING) << "[worker] drain time is up: cancelling " << loop.live() << " requests";
    loop.CancelAll();
  }
  // Let the last messages reach the frontend, then cut what is left.
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  MOE_LOG(INFO) << "[worker] stopped";
  return absl::OkStatus();
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::service::BlockTerminationSignals();
  moe::base::ParseFlags(argc, argv,
      "Serves one Mixture-of-Experts model to moe-frontend (internal worker API).\n"
      "  moe-worker --model=models/default --listen=127.0.0.1:50061 "
      "--metrics_listen=127.0.0.1:9461",
      __FILE__);
  const absl::Status status = moe::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "moe-worker: %s\n", std::string(status.ToString()).c_str());
    return 1;
  }
  return 0;
}
