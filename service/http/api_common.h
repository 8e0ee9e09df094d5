// What the OpenAI and Anthropic adapters share: the API-neutral error and the one mapping of gRPC
// status codes to HTTP, JSON field readers that name the field they refuse, the in-process
// Generate call, and token texts for logprobs.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "moe/v1/moe.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace moe::service::http {

using nlohmann::json;

// An error in API-neutral form; each API writes it in its own JSON shape. `type` uses
// Anthropic's names (invalid_request_error, authentication_error, permission_error,
// not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error), which the
// OpenAI shape reuses as its "type".
struct ApiError {
  int status = 500;
  std::string type = "api_error";
  std::string message;
  std::string param;            // the request field at fault, when one is
  std::string code;             // OpenAI's "code" (model_not_found, invalid_api_key, ...)
  int retry_after_seconds = 0;  // > 0: sent as the retry-after header
};

ApiError MakeError(int status, std::string type, std::string message, std::string param = "");

// The one place that maps a gRPC status to HTTP: INVALID_ARGUMENT 400, UNAUTHENTICATED 401,
// PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429 (retry-after from the trailer
// grpc-retry-pushback-ms, at least 1 s), CANCELLED 499, UNAVAILABLE 503, DEADLINE_EXCEEDED 504,
// the rest 500. `trailers`: the call's trailing metadata (may be null).
ApiError FromGrpc(const grpc::Status& status,
                  const std::multimap<grpc::string_ref, grpc::string_ref>* trailers);

// Thrown by the field readers and the request converters; the handler answers 400 with it.
// An exception rather than a Status (STYLE's "errors are values"): the readers sit deep in JSON
// walks, every failure ends the request the same way, and it never leaves HttpServer's handler.
struct RequestError {
  ApiError error;
};
[[noreturn]] void BadField(const std::string& field, const std::string& why);

// Field readers: absent or null -> nullopt; present with the wrong type -> BadField.
std::optional<double> GetNumber(const json& body, const char* field);
std::optional<int64_t> GetInt(const json& body, const char* field);
std::optional<bool> GetBool(const json& body, const char* field);
std::optional<std::string> GetString(const json& body, const char* field);
// Text from a string or an array of {"type": "text", "text": ...} parts (other part types are
// refused, naming `where`).
std::string TextOf(const json& value, const std::string& where);

// The sampling fields both APIs share, where they are spelled alike: temperature, top_p, top_k,
// min_p, repetition_penalty, presence_penalty, frequency_penalty, seed; and ignore_eos,
// session_id, skip_special_tokens (our extensions, as vLLM spells them).
void ReadSampling(const json& body, moe::v1::GenerateRequest* request);
// A string or a list of strings into stop.strings (`field`: "stop" or "stop_sequences").
void ReadStop(const json& body, const char* field, moe::v1::GenerateRequest* request);

// The public Generate, called through the frontend's own server in-process (admission, routing,
// metrics, deadlines: all gRPC's). Destroying an unfinished call cancels it (the worker frees
// the sequence within a step) and waits for the cancellation to finish.
class Generation {
 public:
  Generation(moe::v1::Inference::Stub& stub, const moe::v1::GenerateRequest& request,
             const std::string& bearer_token);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The next message; false at the end of the stream (then call Finish).
  bool Read(moe::v1::GenerateResponse* response);
  grpc::Status Finish();
  // The call's error as HTTP (after Finish returned it).
  ApiError Error(const grpc::Status& status) const;
  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReader<moe::v1::GenerateResponse>> reader_;
  bool finished_ = false;
};

// Token id -> its text (Detokenize, special tokens kept), cached per request; for logprobs.
class TokenTexts {
 public:
  TokenTexts(moe::v1::Inference::Stub& stub, std::string model, std::string bearer_token)
      : stub_(stub), model_(std::move(model)), token_(std::move(bearer_token)) {}
  const std::string& Text(uint32_t id);

 private:
  moe::v1::Inference::Stub& stub_;
  const std::string model_, token_;
  std::map<uint32_t, std::string> cache_;
};

// OpenAI chat logprobs.content entries for one GenerateResponse's tokens.
json ChatLogprobs(const moe::v1::GenerateResponse& response, TokenTexts& texts);

// A request converted to moe.v1, with what the response needs to know.
struct ParsedRequest {
  moe::v1::GenerateRequest request;
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  bool parse_tools = false;    // tools were offered: recognise tool-call markup in the output
};

// Turns one Generate stream into one API's response. Streaming: each call returns the
// server-sent events to write now (may be empty). Not streaming: OnMessage accumulates and
// OnEnd returns the JSON body.
class Renderer {
 public:
  virtual ~Renderer() = default;
  virtual std::string OnMessage(const moe::v1::GenerateResponse& response) = 0;
  // The last message's Completion (after OnMessage of that message).
  virtual std::string OnEnd(const moe::v1::Completion& completion) = 0;
  // Streaming only: the event that reports an error after the headers went out.
  virtual std::string StreamError(const ApiError& error) = 0;
};

// A random id suffix (24 alphanumerics) for call_..., toolu_... ids.
std::string RandomId();
int64_t UnixSeconds();

}  // namespace moe::service::http
