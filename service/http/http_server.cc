// HttpServer: routes, auth, JSON parsing, and the one loop that relays a Generate stream to a
// response (whole, or as server-sent events).
#include "service/http/http_server.h"

#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/log.h"
#include "service/http/anthropic_api.h"
#include "service/http/openai_api.h"
#include "service/security.h"

namespace moe::service::http {
namespace {

enum class Api { kChatCompletions, kCompletions, kModels, kMessages };

const char* ApiName(Api api) {
  switch (api) {
    case Api::kChatCompletions:
      return "chat_completions";
    case Api::kCompletions:
      return "completions";
    case Api::kModels:
      return "models";
    case Api::kMessages:
      return "messages";
  }
  return "unknown";
}

void SendError(Api api, const ApiError& e, httplib::Response& res) {
  res.status = e.status;
  if (e.retry_after_seconds > 0)
    res.set_header("retry-after", std::to_string(e.retry_after_seconds));
  res.set_content(api == Api::kMessages ? AnthropicErrorBody(e) : OpenAiErrorBody(e),
                  "application/json");
}

// Authorization: Bearer <token> (OpenAI) or x-api-key: <token> (Anthropic).
std::optional<ApiError> CheckToken(const httplib::Request& req, const std::string& token) {
  if (token.empty()) return std::nullopt;
  ApiError e;
  e.status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  std::string given;
  if (req.has_header("x-api-key")) {
    given = req.get_header_value("x-api-key");
  } else if (req.has_header("Authorization")) {
    const std::string value = req.get_header_value("Authorization");
    if (!absl::StartsWithIgnoreCase(value, "bearer ")) {
      e.message = "Authorization: the scheme must be Bearer";
      return e;
    }
    given = value.substr(7);
  } else {
    e.message = "missing 'Authorization: Bearer <token>' or 'x-api-key' header";
    return e;
  }
  if (!ConstantTimeEquals(given, token)) {
    e.message = "wrong API key";
    return e;
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const HttpOptions& options, std::shared_ptr<grpc::Channel> channel,
    metrics::FrontendMetrics& metrics) {
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->options_ = options;
  s->stub_ = moe::v1::Inference::NewStub(channel);
  s->metrics_ = &metrics;
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("the TLS certificate and key go together");
  }
  if (!options.tls_cert.empty()) {
    auto ssl =
        std::make_unique<httplib::SSLServer>(options.tls_cert.c_str(), options.tls_key.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot load the TLS certificate ", options.tls_cert, " and key ", options.tls_key));
    }
    s->server_ = std::move(ssl);
  } else {
    s->server_ = std::make_unique<httplib::Server>();
  }
  const size_t colon = options.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", options.listen, "' is not HOST:PORT"));
  }
  std::string host = options.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const int threads = std::max(1, options.threads);
  s->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->server_->set_payload_max_length(options.max_body_bytes);
  s->Route();
  s->port_ = port == 0 ? s->server_->bind_to_any_port(host) : port;
  if (port != 0 && !s->server_->bind_to_port(host, port)) s->port_ = -1;
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("http: cannot listen on ", options.listen,
                                               " (in use, or not an address of this host)"));
  }
  s->thread_ = std::thread([srv = s->server_.get()] { srv->listen_after_bind(); });
  return s;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Route() {
  // Every request: count it by api and status when it is answered.
  auto handle = [this](Api api,
                       std::function<void(const httplib::Request&, httplib::Response&)> fn) {
    return [this, api, fn](const httplib::Request& req, httplib::Response& res) {
      if (std::optional<ApiError> denied = CheckToken(req, options_.auth_token)) {
        SendError(api, *denied, res);
      } else {
        try {
          fn(req, res);
        } catch (const RequestError& e) {
          SendError(api, e.error, res);
        } catch (const std::exception& e) {  // a bug of ours, never the client's input
          MOE_LOG(ERROR) << "[http] " << req.path << ": " << e.what();
          SendError(api, MakeError(500, "api_error", e.what()), res);
        }
      }
      metrics_->HttpRequest(ApiName(api), res.status);
    };
  };

  // Runs one Generate; answers with the rendered body, the event stream, or the error.
  auto generate = [this](Api api, const ParsedRequest& parsed, const httplib::Request& req,
                         httplib::Response& res) {
    moe::v1::GenerateRequest request = parsed.request;
    if (request.session_id().empty() && req.has_header("x-session-id")) {
      request.set_session_id(req.get_header_value("x-session-id"));
    }
    if (req.has_header("x-request-id"))
      request.set_request_id(req.get_header_value("x-request-id"));
    auto texts = std::make_shared<TokenTexts>(*stub_, request.model(), options_.auth_token);
    std::shared_ptr<Renderer> renderer = api == Api::kMessages ? MakeMessagesRenderer(parsed)
                                         : api == Api::kCompletions
                                             ? MakeCompletionRenderer(parsed, texts.get())
                                             : MakeChatRenderer(parsed, texts.get());
    auto gen = std::make_shared<Generation>(*stub_, request, options_.auth_token);
    // The first message decides the HTTP status: refusals (invalid, unknown model, queue full,
    // no worker) come before it.
    auto first = std::make_shared<moe::v1::GenerateResponse>();
    if (!gen->Read(first.get())) {
      const grpc::Status status = gen->Finish();
      ApiError e = status.ok() ? MakeError(500, "api_error", "the stream ended without a message")
                               : gen->Error(status);
      SendError(api, e, res);
      return;
    }
    if (!parsed.stream) {
      std::string body;
      moe::v1::GenerateResponse& msg = *first;
      do {
        renderer->OnMessage(msg);
        if (msg.has_completion()) body = renderer->OnEnd(msg.completion());
      } while (gen->Read(&msg));
      const grpc::Status status = gen->Finish();
      if (!status.ok()) return SendError(api, gen->Error(status), res);
      if (body.empty()) {
        return SendError(api, MakeError(500, "api_error", "the stream ended without completion"),
                         res);
      }
      res.set_content(body, "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    // cpp-httplib 0.11 gzips any text/* body the client accepts gzip for, and its compressor
    // holds output back until it has a block: events would arrive late, all at once. A stream
    // goes out uncompressed (the request is ours to edit: httplib reads it only to choose this).
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
    res.set_chunked_content_provider(
        "text/event-stream", [gen, renderer, first, texts](size_t, httplib::DataSink& sink) {
          moe::v1::GenerateResponse& msg = *first;
          do {
            std::string out = renderer->OnMessage(msg);
            if (msg.has_completion()) out += renderer->OnEnd(msg.completion());
            if (!out.empty() && !sink.write(out.data(), out.size())) {
              gen->Cancel();  // the client went away: the worker frees the sequence
              return false;
            }
          } while (gen->Read(&msg));
          const grpc::Status status = gen->Finish();
          if (!status.ok()) {
            const std::string out = renderer->StreamError(gen->Error(status));
            sink.write(out.data(), out.size());
          }
          sink.done();
          return true;
        });
  };

  auto parse_body = [](const httplib::Request& req) {
    json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) {
      throw RequestError{MakeError(400, "invalid_request_error", "body: not valid JSON", "body")};
    }
    if (!body.is_object()) BadField("body", "must be a JSON object");
    return body;
  };

  server_->Post("/v1/chat/completions",
                handle(Api::kChatCompletions, [=](const auto& req, auto& res) {
                  generate(Api::kChatCompletions, ParseChatCompletion(parse_body(req)), req, res);
                }));
  server_->Post("/v1/completions", handle(Api::kCompletions, [=](const auto& req, auto& res) {
                  generate(Api::kCompletions, ParseCompletion(parse_body(req)), req, res);
                }));
  server_->Post("/v1/messages", handle(Api::kMessages, [=](const auto& req, auto& res) {
                  generate(Api::kMessages, ParseMessages(parse_body(req)), req, res);
                }));
  server_->Get("/v1/models", handle(Api::kModels, [this](const auto& req, auto& res) {
                 grpc::ClientContext ctx;
                 if (!options_.auth_token.empty()) {
                   ctx.AddMetadata("authorization", "Bearer " + options_.auth_token);
                 }
                 moe::v1::ListModelsResponse models;
                 const grpc::Status st =
                     stub_->ListModels(&ctx, moe::v1::ListModelsRequest(), &models);
                 if (!st.ok()) {
                   const auto& trailers = ctx.GetServerTrailingMetadata();
                   return SendError(Api::kModels, FromGrpc(st, &trailers), res);
                 }
                 res.set_content(OpenAiModelList(models).dump(), "application/json");
               }));
  // Anything else: 404 in OpenAI's shape (Anthropic clients only call /v1/messages).
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e = MakeError(
        res.status, res.status == 413 ? "request_too_large" : "not_found_error",
        absl::StrCat(req.method, " ", req.path, ": ",
                     res.status == 413 ? "the body is over the size limit" : "no such endpoint"));
    if (res.status != 404 && res.status != 413) e.type = "invalid_request_error";
    res.set_content(OpenAiErrorBody(e), "application/json");
  });
}

}  // namespace moe::service::http
