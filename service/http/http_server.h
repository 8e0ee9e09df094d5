// HttpServer: the OpenAI- and Anthropic-compatible HTTP API of moe-frontend. Each request is
// turned into a moe.v1 call on the frontend's own gRPC server through an in-process channel, so
// admission, routing, metrics, deadlines and cancellation are exactly those of gRPC calls.
//
//   POST /v1/chat/completions   OpenAI chat (stream: chat.completion.chunk events)
//   POST /v1/completions        OpenAI completions (legacy; text or token ids)
//   GET  /v1/models             OpenAI model list
//   POST /v1/messages           Anthropic messages (stream: message_start ... message_stop)
//
// Threads: one per open connection (a pool of `threads`); a streaming request holds its thread
// while it streams. A client that disconnects mid-stream cancels its gRPC call at the next write.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "moe/v1/moe.grpc.pb.h"
#include "service/metrics/frontend_metrics.h"

namespace httplib {
class Server;
}

namespace moe::service::http {

struct HttpOptions {
  std::string listen;             // HOST:PORT (port 0: any). Required
  std::string tls_cert, tls_key;  // PEM files: both set -> HTTPS. Default: plain HTTP
  // When set, requests need "Authorization: Bearer <token>" or "x-api-key: <token>"; it is then
  // forwarded to the gRPC service as the call's bearer token. Default: open.
  std::string auth_token;
  int threads = 256;                // connections served at once (streams included)
  size_t max_body_bytes = 4 << 20;  // larger bodies get 413
};

class HttpServer {
 public:
  // Listens and serves on its own thread. `channel`: the frontend's in-process channel.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpOptions& options,
                                                           std::shared_ptr<grpc::Channel> channel,
                                                           metrics::FrontendMetrics& metrics);
  ~HttpServer();  // Stop()

  int port() const { return port_; }
  // Stops accepting and closes connections; open streams' gRPC calls are cancelled.
  void Stop();

 private:
  HttpServer() = default;
  void Route();

  HttpOptions options_;
  std::unique_ptr<moe::v1::Inference::Stub> stub_;
  metrics::FrontendMetrics* metrics_ = nullptr;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace moe::service::http
