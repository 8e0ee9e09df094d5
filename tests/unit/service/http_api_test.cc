// The HTTP API's request mapping (OpenAI and Anthropic bodies -> moe.v1.GenerateRequest) and the
// one gRPC -> HTTP status mapping.
#include <gtest/gtest.h>

#include "service/http/anthropic_api.h"
#include "service/http/api_common.h"
#include "service/http/openai_api.h"

namespace moe::service::http {
namespace {

json Parse(const char* text) { return json::parse(text); }

// The field a refused body names.
std::string Refused(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const RequestError& e) {
    EXPECT_EQ(e.error.status, 400);
    return e.error.param;
  }
  return "(accepted)";
}

TEST(HttpApi, OpenAiChatFields) {
  ParsedRequest p = ParseChatCompletion(Parse(R"({
    "model": "m", "temperature": 0.5, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
    "repetition_penalty": 1.1, "presence_penalty": 0.2, "frequency_penalty": 0.3, "seed": 7,
    "stop": ["a", "b"], "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3,
    "stream": true, "stream_options": {"include_usage": true}, "session_id": "s",
    "chat_template_kwargs": {"enable_thinking": false}, "whatever": 1,
    "messages": [
      {"role": "developer", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})"));
  const auto& r = p.request;
  EXPECT_EQ(r.model(), "m");
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_EQ(r.sampling().top_k(), 0);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), 0.2f);
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), 0.3f);
  EXPECT_EQ(r.sampling().seed(), 7u);
  ASSERT_EQ(r.stop().strings_size(), 2);
  EXPECT_EQ(r.stop().strings(1), "b");
  EXPECT_EQ(r.max_tokens(), 9u);
  EXPECT_TRUE(r.logprobs());
  EXPECT_EQ(r.top_logprobs(), 3u);
  EXPECT_EQ(r.session_id(), "s");
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_TRUE(p.parse_tools);
  const auto& chat = r.chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "hi there");
  EXPECT_EQ(chat.messages(2).reasoning_content(), "hmm");
  ASSERT_EQ(chat.messages(2).tool_calls_size(), 1);
  EXPECT_EQ(chat.messages(2).tool_calls(0).id(), "c1");
  EXPECT_EQ(chat.messages(2).tool_calls(0).arguments(), "{\"x\":1}");
  EXPECT_EQ(chat.messages(3).role(), "tool");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "c1");
  EXPECT_EQ(json::parse(chat.tools_json())[0]["function"]["name"], "f");
  EXPECT_EQ(chat.template_kwargs_json(), R"({"enable_thinking":false})");
}

TEST(HttpApi, OpenAiToolChoice) {
  const char* tools =
      R"("tools": [{"type": "function", "function": {"name": "a"}},
                   {"type": "function", "function": {"name": "b"}}])";
  auto parse = [&](const std::string& choice) {
    return ParseChatCompletion(json::parse(R"({"model": "m", "messages": [{"role": "user",
        "content": "x"}], )" + std::string(tools) +
                                           choice + "}"));
  };
  ParsedRequest none = parse(R"(, "tool_choice": "none")");
  EXPECT_FALSE(none.parse_tools);
  EXPECT_TRUE(none.request.chat().tools_json().empty());
  ParsedRequest named =
      parse(R"(, "tool_choice": {"type": "function", "function": {"name": "b"}})");
  EXPECT_EQ(json::parse(named.request.chat().tools_json()).size(), 1u);
  EXPECT_EQ(json::parse(named.request.chat().tools_json())[0]["function"]["name"], "b");
  EXPECT_EQ(json::parse(parse(R"(, "tool_choice": "required")").request.chat().tools_json()).size(),
            2u);
  EXPECT_EQ(Refused([&] { parse(R"(, "tool_choice": "sometimes")"); }), "tool_choice");
}

TEST(HttpApi, RefusalsNameTheField) {
  auto chat = [](const std::string& extra) {
    return [extra] {
      ParseChatCompletion(json::parse(
          R"({"model": "m", "messages": [{"role": "user", "content": "x"}])" + extra + "}"));
    };
  };
  EXPECT_EQ(Refused(chat(R"(, "temperature": "hot")")), "temperature");
  EXPECT_EQ(Refused(chat(R"(, "n": 2)")), "n");
  EXPECT_EQ(Refused(chat(R"(, "max_tokens": 0)")), "max_tokens");
  EXPECT_EQ(Refused(chat(R"(, "stop": [1])")), "stop[0]");
  EXPECT_EQ(Refused(chat(R"(, "top_logprobs": 2)")), "top_logprobs");  // without logprobs
  EXPECT_EQ(Refused(chat(R"(, "seed": 1.5)")), "seed");
  EXPECT_EQ(Refused([] { ParseChatCompletion(Parse(R"({"messages": []})")); }), "model");
  EXPECT_EQ(Refused([] {
              ParseChatCompletion(Parse(R"({"model": "m", "messages": [{"role": "user",
                  "content": [{"type": "image_url", "image_url": {}}]}]})"));
            }),
            "messages[0].content[0]");
  EXPECT_EQ(
      Refused([] { ParseCompletion(Parse(R"({"model": "m", "prompt": "x", "echo": true})")); }),
      "echo");
  EXPECT_EQ(Refused([] { ParseMessages(Parse(R"({"model": "m", "messages": []})")); }),
            "max_tokens");
}

TEST(HttpApi, CompletionPromptForms) {
  EXPECT_EQ(ParseCompletion(Parse(R"({"model": "m", "prompt": ["hi"]})")).request.text(), "hi");
  ParsedRequest ids =
      ParseCompletion(Parse(R"({"model": "m", "prompt": [1, 2, 3], "logprobs": 2})"));
  EXPECT_EQ(ids.request.token_ids().ids_size(), 3);
  EXPECT_TRUE(ids.request.logprobs());
  EXPECT_EQ(ids.request.top_logprobs(), 2u);
}

TEST(HttpApi, AnthropicMessages) {
  ParsedRequest p = ParseMessages(Parse(R"({
    "model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "sys"}],
    "stop_sequences": ["END"], "top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 100},
    "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}],
    "messages": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                        {"type": "text", "text": "calling"},
                                        {"type": "tool_use", "id": "u1", "name": "get",
                                         "input": {"k": "v"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1",
                                    "content": [{"type": "text", "text": "r"}]},
                                   {"type": "text", "text": "thanks"}]}]})"));
  const auto& chat = p.request.chat();
  EXPECT_EQ(p.request.max_tokens(), 16u);
  EXPECT_EQ(p.request.stop().strings(0), "END");
  EXPECT_EQ(p.request.sampling().top_k(), 5);
  ASSERT_EQ(chat.messages_size(), 5);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(2).reasoning_content(), "t");
  EXPECT_EQ(chat.messages(2).content(), "calling");
  EXPECT_EQ(chat.messages(2).tool_calls(0).arguments(), R"({"k":"v"})");
  EXPECT_EQ(chat.messages(3).role(), "tool");
  EXPECT_EQ(chat.messages(3).tool_call_id(), "u1");
  EXPECT_EQ(chat.messages(3).content(), "r");
  EXPECT_EQ(chat.messages(4).content(), "thanks");
  EXPECT_EQ(chat.template_kwargs_json(), R"({"enable_thinking":true})");
  const json tools = json::parse(chat.tools_json());
  EXPECT_EQ(tools[0]["type"], "function");
  EXPECT_EQ(tools[0]["function"]["name"], "get");
  EXPECT_EQ(tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_TRUE(p.parse_tools);
}

TEST(HttpApi, GrpcCodesMapOnce) {
  std::multimap<grpc::string_ref, grpc::string_ref> trailers;
  trailers.emplace("grpc-retry-pushback-ms", "2500");
  struct Case {
    grpc::StatusCode code;
    int status;
    const char* type;
  };
  for (const Case& c : std::vector<Case>{
           {grpc::StatusCode::INVALID_ARGUMENT, 400, "invalid_request_error"},
           {grpc::StatusCode::UNAUTHENTICATED, 401, "authentication_error"},
           {grpc::StatusCode::PERMISSION_DENIED, 403, "permission_error"},
           {grpc::StatusCode::NOT_FOUND, 404, "not_found_error"},
           {grpc::StatusCode::RESOURCE_EXHAUSTED, 429, "rate_limit_error"},
           {grpc::StatusCode::CANCELLED, 499, "api_error"},
           {grpc::StatusCode::UNAVAILABLE, 503, "overloaded_error"},
           {grpc::StatusCode::DEADLINE_EXCEEDED, 504, "api_error"},
           {grpc::StatusCode::INTERNAL, 500, "api_error"},
           {grpc::StatusCode::DATA_LOSS, 500, "api_error"},
       }) {
    const ApiError e = FromGrpc(grpc::Status(c.code, "why"), &trailers);
    EXPECT_EQ(e.status, c.status) << c.code;
    EXPECT_EQ(e.type, c.type) << c.code;
    EXPECT_EQ(e.message, "why");
  }
  EXPECT_EQ(FromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, ""), &trailers)
                .retry_after_seconds,
            3);
  EXPECT_EQ(
      FromGrpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, ""), nullptr).retry_after_seconds,
      1);
  const json openai =
      json::parse(OpenAiErrorBody(MakeError(400, "invalid_request_error", "m", "p")));
  EXPECT_EQ(openai["error"]["param"], "p");
  EXPECT_TRUE(openai["error"]["code"].is_null());
  const json anthropic = json::parse(AnthropicErrorBody(MakeError(404, "not_found_error", "m")));
  EXPECT_EQ(anthropic["type"], "error");
  EXPECT_EQ(anthropic["error"]["type"], "not_found_error");
}

}  // namespace
}  // namespace moe::service::http
