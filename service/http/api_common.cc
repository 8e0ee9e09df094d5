// Error mapping, field readers, the in-process Generate call, token texts.
#include "service/http/api_common.h"

#include <chrono>
#include <cmath>
#include <random>

#include "absl/strings/numbers.h"

namespace moe::service::http {

ApiError MakeError(int status, std::string type, std::string message, std::string param) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError FromGrpc(const grpc::Status& status,
                  const std::multimap<grpc::string_ref, grpc::string_ref>* trailers) {
  ApiError e;
  e.message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      e.status = 400, e.type = "invalid_request_error";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      e.status = 401, e.type = "authentication_error", e.code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      e.status = 403, e.type = "permission_error";
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.status = 404, e.type = "not_found_error", e.code = "model_not_found";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: {
      e.status = 429, e.type = "rate_limit_error", e.code = "rate_limit_exceeded";
      int64_t ms = 1000;
      if (trailers != nullptr) {
        auto it = trailers->find("grpc-retry-pushback-ms");
        int64_t v = 0;
        if (it != trailers->end() &&
            absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &v)) {
          ms = v;
        }
      }
      e.retry_after_seconds = static_cast<int>(std::max<int64_t>(1, (ms + 999) / 1000));
      break;
    }
    case grpc::StatusCode::CANCELLED:
      e.status = 499, e.type = "api_error", e.code = "cancelled";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.status = 503, e.type = "overloaded_error", e.code = "unavailable";
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.status = 504, e.type = "api_error", e.code = "timeout";
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      e.status = 501, e.type = "api_error";
      break;
    default:  // INTERNAL, DATA_LOSS, UNKNOWN, ABORTED, ALREADY_EXISTS
      e.status = 500, e.type = "api_error";
      break;
  }
  return e;
}

void BadField(const std::string& field, const std::string& why) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.param = field;
  e.message = field + ": " + why;
  throw RequestError{std::move(e)};
}

namespace {
const json* Field(const json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}
}  // namespace

std::optional<double> GetNumber(const json& body, const char* field) {
  const json* v = Field(body, field);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) BadField(field, "must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d)) BadField(field, "must be finite");
  return d;
}

std::optional<int64_t> GetInt(const json& body, const char* field) {
  const json* v = Field(body, field);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) BadField(field, "must be an integer");
  return v->get<int64_t>();
}

std::optional<bool> GetBool(const json& body, const char* field) {
  const json* v = Field(body, field);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) BadField(field, "must be true or false");
  return v->get<bool>();
}

std::optional<std::string> GetString(const json& body, const char* field) {
  const json* v = Field(body, field);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) BadField(field, "must be a string");
  return v->get<std::string>();
}

std::string TextOf(const json& value, const std::string& where) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  if (!value.is_array()) BadField(where, "must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < value.size(); ++i) {
    const json& part = value[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      BadField(at, "only {\"type\": \"text\", \"text\": ...} parts are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

void ReadSampling(const json& body, moe::v1::GenerateRequest* request) {
  moe::v1::SamplingParams* s = request->mutable_sampling();
  if (auto v = GetNumber(body, "temperature")) s->set_temperature(static_cast<float>(*v));
  if (auto v = GetNumber(body, "top_p")) s->set_top_p(static_cast<float>(*v));
  if (auto v = GetInt(body, "top_k")) {
    // OpenAI-compatible servers use -1 for "off"; ours is 0.
    if (*v < -1 || *v > INT32_MAX) BadField("top_k", "must be -1, 0 (off) or positive");
    s->set_top_k(static_cast<int32_t>(std::max<int64_t>(0, *v)));
  }
  if (auto v = GetNumber(body, "min_p")) s->set_min_p(static_cast<float>(*v));
  if (auto v = GetNumber(body, "repetition_penalty")) {
    s->set_repetition_penalty(static_cast<float>(*v));
  }
  if (auto v = GetNumber(body, "presence_penalty")) s->set_presence_penalty(static_cast<float>(*v));
  if (auto v = GetNumber(body, "frequency_penalty")) {
    s->set_frequency_penalty(static_cast<float>(*v));
  }
  if (auto v = GetInt(body, "seed")) s->set_seed(static_cast<uint64_t>(*v));
  if (auto v = GetBool(body, "ignore_eos")) request->mutable_stop()->set_ignore_eos(*v);
  if (auto v = GetBool(body, "skip_special_tokens")) request->set_skip_special_tokens(*v);
  if (auto v = GetString(body, "session_id")) request->set_session_id(*v);
}

void ReadStop(const json& body, const char* field, moe::v1::GenerateRequest* request) {
  const json* v = Field(body, field);
  if (v == nullptr) return;
  if (v->is_string()) {
    request->mutable_stop()->add_strings(v->get<std::string>());
    return;
  }
  if (!v->is_array()) BadField(field, "must be a string or an array of strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) {
      BadField(std::string(field) + "[" + std::to_string(i) + "]", "must be a string");
    }
    request->mutable_stop()->add_strings((*v)[i].get<std::string>());
  }
}

Generation::Generation(moe::v1::Inference::Stub& stub, const moe::v1::GenerateRequest& request,
                       const std::string& bearer_token) {
  if (!bearer_token.empty()) context_.AddMetadata("authorization", "Bearer " + bearer_token);
  reader_ = stub.Generate(&context_, request);
}

Generation::~Generation() {
  if (finished_) return;
  context_.TryCancel();
  moe::v1::GenerateResponse ignored;
  while (reader_->Read(&ignored)) {
  }
  reader_->Finish();
}

bool Generation::Read(moe::v1::GenerateResponse* response) { return reader_->Read(response); }

grpc::Status Generation::Finish() {
  finished_ = true;
  return reader_->Finish();
}

ApiError Generation::Error(const grpc::Status& status) const {
  const auto& trailers = context_.GetServerTrailingMetadata();
  return FromGrpc(status, &trailers);
}

const std::string& TokenTexts::Text(uint32_t id) {
  auto it = cache_.find(id);
  if (it != cache_.end()) return it->second;
  grpc::ClientContext ctx;
  if (!token_.empty()) ctx.AddMetadata("authorization", "Bearer " + token_);
  moe::v1::DetokenizeRequest req;
  req.set_model(model_);
  req.add_token_ids(id);
  moe::v1::DetokenizeResponse resp;
  // A failure (the worker went away) leaves the text empty; the logprob itself is still right.
  (void)stub_.Detokenize(&ctx, req, &resp);
  return cache_.emplace(id, resp.text()).first->second;
}

namespace {
json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

json ChatLogprobs(const moe::v1::GenerateResponse& response, TokenTexts& texts) {
  json content = json::array();
  for (int i = 0; i < response.logprobs_size() && i < response.token_ids_size(); ++i) {
    const moe::v1::TokenLogprob& lp = response.logprobs(i);
    const std::string& text = texts.Text(response.token_ids(i));
    json top = json::array();
    for (const moe::v1::TopLogprob& t : lp.top()) {
      const std::string& alt = texts.Text(t.token_id());
      top.push_back({{"token", alt}, {"logprob", t.logprob()}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", text},
                       {"logprob", lp.logprob()},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", top}});
  }
  return content;
}

std::string RandomId() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng(std::random_device{}());
  std::string id(24, 'x');
  for (char& c : id) c = kChars[rng() % (sizeof(kChars) - 1)];
  return id;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace moe::service::http
