// Request validation names the field and the reason; conversion applies documented defaults.
#include "service/proto_convert.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>

#include "engine/tokenizer/unicode.h"
#include "service/proto_validate.h"
#include "service/status_convert.h"

namespace moe::service {
namespace {

moe::v1::GenerateRequest Valid() {
  moe::v1::GenerateRequest r;
  r.set_model("m");
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(2);
  return r;
}

const ModelLimits kLimits{/*vocab_size=*/100, /*context_length=*/64};

void ExpectInvalid(const moe::v1::GenerateRequest& r, const std::string& words) {
  const absl::Status st = ValidateGenerateRequest(r, kLimits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << words;
  EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
}

TEST(ValidateGenerateRequest, AcceptsAValidRequest) {
  EXPECT_TRUE(ValidateGenerateRequest(Valid(), kLimits).ok());
}

TEST(ValidateGenerateRequest, NamesTheBadField) {
  auto r = Valid();
  r.clear_model();
  ExpectInvalid(r, "model: is required");
  r = Valid();
  r.clear_input();
  ExpectInvalid(r, "input: one of text, chat or token_ids");
  r = Valid();
  r.set_text("");
  ExpectInvalid(r, "text: the prompt is empty");
  r = Valid();
  r.mutable_token_ids()->set_ids(1, 100);
  ExpectInvalid(r, "token_ids.ids[1]: 100 is outside the vocabulary");
  r = Valid();
  for (int i = 0; i < 70; ++i) r.mutable_token_ids()->add_ids(1);
  ExpectInvalid(r, "the context length is 64");
  r = Valid();
  r.set_max_tokens(0);
  ExpectInvalid(r, "max_tokens: must be at least 1");
  r.set_max_tokens(63);
  ExpectInvalid(r, "over the context length 64");
  r = Valid();
  r.mutable_sampling()->set_temperature(std::nanf(""));
  ExpectInvalid(r, "sampling.temperature: nan is not a finite number");
  r.mutable_sampling()->set_temperature(-1);
  ExpectInvalid(r, "sampling.temperature: -1 is negative");
  r = Valid();
  r.mutable_sampling()->set_top_p(0);
  ExpectInvalid(r, "sampling.top_p: 0 is outside (0, 1]");
  r.mutable_sampling()->set_top_p(std::numeric_limits<float>::infinity());
  ExpectInvalid(r, "sampling.top_p: inf is not a finite number");
  r = Valid();
  r.mutable_sampling()->set_min_p(1.5);
  ExpectInvalid(r, "sampling.min_p");
  r = Valid();
  r.mutable_sampling()->set_repetition_penalty(0);
  ExpectInvalid(r, "sampling.repetition_penalty");
  r = Valid();
  r.mutable_sampling()->set_frequency_penalty(3);
  ExpectInvalid(r, "sampling.frequency_penalty: 3 is outside [-2, 2]");
  r = Valid();
  r.mutable_sampling()->set_top_k(-1);
  ExpectInvalid(r, "sampling.top_k");
  r = Valid();
  r.mutable_stop()->add_strings("");
  ExpectInvalid(r, "stop.strings[0]");
  r = Valid();
  r.mutable_stop()->add_token_ids(1000);
  ExpectInvalid(r, "stop.token_ids[0]");
  r = Valid();
  r.set_top_logprobs(21);
  ExpectInvalid(r, "top_logprobs");
  r = Valid();
  r.set_session_id(std::string(200, 's'));
  ExpectInvalid(r, "session_id");
  r = Valid();
  r.mutable_chat();
  ExpectInvalid(r, "chat.messages");
  r.mutable_chat()->add_messages()->set_content("hi");
  ExpectInvalid(r, "chat.messages[0].role");
  r = Valid();
  moe::v1::ChatMessage* system = r.mutable_chat()->add_messages();
  system->set_role("system");  // an empty system turn is fine
  moe::v1::ChatMessage* user = r.mutable_chat()->add_messages();
  user->set_role("user");
  ExpectInvalid(r, "chat.messages[1].content");
  user->set_content("hi");
  EXPECT_TRUE(ValidateGenerateRequest(r, ModelLimits{}).ok());
}

TEST(ValidateGenerateRequest, UnknownLimitsAreNotChecked) {
  auto r = Valid();
  r.mutable_token_ids()->set_ids(0, 1 << 30);
  EXPECT_TRUE(ValidateGenerateRequest(r, ModelLimits{}).ok());
}

void ExpectInvalidTokenize(const moe::v1::TokenizeRequest& r, const std::string& words) {
  const absl::Status st = ValidateTokenizeRequest(r);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << words;
  EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
}

// Tokenize checks the fields it shares with Generate as Generate does (issue 29).
TEST(ValidateTokenizeRequest, ChecksTheFieldsSharedWithGenerate) {
  moe::v1::TokenizeRequest r;
  r.set_model("m");
  r.set_text("hello");
  EXPECT_TRUE(ValidateTokenizeRequest(r).ok());
  r.clear_model();
  ExpectInvalidTokenize(r, "model: is required");
  r.set_model("m");
  r.clear_input();
  ExpectInvalidTokenize(r, "input: one of text or chat");
  r.set_text("");
  ExpectInvalidTokenize(r, "text: the prompt is empty");
  r.mutable_chat();
  ExpectInvalidTokenize(r, "chat.messages: at least one message");
  auto* m = r.mutable_chat()->add_messages();
  m->set_role("system");
  m = r.mutable_chat()->add_messages();
  m->set_role("user");
  ExpectInvalidTokenize(r, "chat.messages[1].content: a user turn is empty");
  m->set_content("hi");
  EXPECT_TRUE(ValidateTokenizeRequest(r).ok());
  m->clear_role();
  ExpectInvalidTokenize(r, "chat.messages[1].role: is empty");
}

// A string field proto3 refuses as not UTF-8 is found by its path, at any depth.
TEST(InvalidUtf8Field, NamesTheField) {
  const google::protobuf::Descriptor& d = *moe::v1::GenerateRequest::descriptor();
  moe::v1::GenerateRequest r;
  r.set_model("m");
  auto* chat = r.mutable_chat();
  chat->add_messages()->set_role("system");
  auto* user = chat->add_messages();
  user->set_role("user");
  user->set_content("ok \xc3\xa9");  // valid: e with acute
  r.mutable_stop()->add_strings("a");
  r.mutable_stop()->add_strings("b");
  std::string bytes;
  // SerializePartialToString does not check UTF-8 (only debug builds would complain).
  ASSERT_TRUE(r.SerializePartialToString(&bytes));
  EXPECT_EQ(InvalidUtf8Field(d, bytes), "");

  user->set_content("bad \xff byte");
  ASSERT_TRUE(r.SerializePartialToString(&bytes));
  moe::v1::GenerateRequest parsed;
  EXPECT_FALSE(parsed.ParseFromString(bytes));  // what the frontend's Deserialize meets
  EXPECT_EQ(InvalidUtf8Field(d, bytes), "chat.messages[1].content");

  user->set_content("fine");
  r.mutable_stop()->set_strings(1, "\xed\xa0\x80");  // a UTF-16 surrogate, refused in UTF-8
  ASSERT_TRUE(r.SerializePartialToString(&bytes));
  EXPECT_EQ(InvalidUtf8Field(d, bytes), "stop.strings[1]");

  r.mutable_stop()->set_strings(1, "b");
  r.set_model("m\xc0");
  ASSERT_TRUE(r.SerializePartialToString(&bytes));
  EXPECT_EQ(InvalidUtf8Field(d, bytes), "model");
  // Bytes that are not a message at all name nothing.
  EXPECT_EQ(InvalidUtf8Field(d, "\x0a\xff\xff\xff"), "");
}

// The frontend's UTF-8 check (no engine code) accepts exactly what the tokenizer's decoder does:
// every string of 1 to 3 bytes, and 4-byte strings over the boundary bytes of each position.
TEST(IsValidUtf8, AgreesWithTheTokenizersDecoder) {
  auto agree = [](const std::string& s) {
    return IsValidUtf8(s) == engine::DecodeUtf8(s).ok();
  };
  int64_t disagreements = 0;
  std::string s;
  for (int a = 0; a < 256; ++a) {
    s.assign(1, static_cast<char>(a));
    disagreements += !agree(s);
    for (int b = 0; b < 256; ++b) {
      s.assign({static_cast<char>(a), static_cast<char>(b)});
      disagreements += !agree(s);
      for (int c = 0; c < 256; ++c) {
        s.assign({static_cast<char>(a), static_cast<char>(b), static_cast<char>(c)});
        disagreements += !agree(s);
        if (a < 0xF0 || a > 0xF7) continue;
        for (int d : {0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xFF}) {
          s.push_back(static_cast<char>(d));
          disagreements += !agree(s);
          s.pop_back();
        }
      }
    }
  }
  EXPECT_EQ(disagreements, 0);
  EXPECT_TRUE(IsValidUtf8("ok \xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));           // overlong
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xe2\x82"));           // cut short
}

TEST(ToStopConditions, DefaultMaxTokensFitsTheContext) {
  auto r = Valid();
  EXPECT_EQ(ToStopConditions(r, 2, 4096).max_tokens, kDefaultMaxTokens);
  EXPECT_EQ(ToStopConditions(r, 60, 64).max_tokens, 4);
  r.set_max_tokens(7);
  r.mutable_stop()->add_strings("\n\n");
  r.mutable_stop()->set_ignore_eos(true);
  const engine::StopConditions stop = ToStopConditions(r, 2, 64);
  EXPECT_EQ(stop.max_tokens, 7);
  EXPECT_EQ(stop.stop_strings, std::vector<std::string>{"\n\n"});
  EXPECT_TRUE(stop.ignore_eos);
}

TEST(ToSamplingParams, UnsetFieldsKeepEngineDefaults) {
  moe::v1::SamplingParams s;
  EXPECT_EQ(ToSamplingParams(s).temperature, engine::SamplingParams{}.temperature);
  s.set_temperature(0);  // explicit 0 is greedy, not "unset"
  s.set_seed(42);
  EXPECT_EQ(ToSamplingParams(s).temperature, 0.f);
  EXPECT_EQ(ToSamplingParams(s).seed, 42u);
}

TEST(StatusConvert, DeadlinePassedAllowsGrpcClockSlack) {
  const auto now = std::chrono::system_clock::now();
  EXPECT_TRUE(DeadlinePassed(now - std::chrono::seconds(1), now));
  EXPECT_TRUE(DeadlinePassed(now, now));
  // gRPC's timer may fire a little before system_clock reaches the deadline.
  EXPECT_TRUE(DeadlinePassed(now + kDeadlineSlack / 2, now));
  EXPECT_FALSE(DeadlinePassed(now + std::chrono::seconds(1), now));
  EXPECT_FALSE(DeadlinePassed(std::chrono::system_clock::time_point::max(), now));
}

// Tool calls need a name and JSON-object arguments; tools and template variables are JSON of the
// right kind. Tool and assistant turns may be empty.
TEST(ValidateChat, ToolCallsToolsAndTemplateVariables) {
  moe::v1::TokenizeRequest r;
  r.set_model("m");
  moe::v1::ChatMessages* chat = r.mutable_chat();
  auto* user = chat->add_messages();
  user->set_role("user");
  user->set_content("weather?");
  auto* assistant = chat->add_messages();
  assistant->set_role("assistant");
  moe::v1::ToolCall* call = assistant->add_tool_calls();
  auto* tool = chat->add_messages();
  tool->set_role("tool");
  tool->set_tool_call_id("c1");
  ExpectInvalidTokenize(r, "chat.messages[1].tool_calls[0].name: is required");
  call->set_name("get_weather");
  EXPECT_TRUE(ValidateTokenizeRequest(r).ok());  // empty arguments mean {}
  call->set_arguments("{\"city\": ");
  ExpectInvalidTokenize(r, "chat.messages[1].tool_calls[0].arguments: is not valid JSON");
  call->set_arguments("[1]");
  ExpectInvalidTokenize(r, "chat.messages[1].tool_calls[0].arguments: is not a JSON object");
  call->set_arguments("{\"city\": \"Paris\"}");
  chat->set_tools_json("{\"type\": \"function\"}");
  ExpectInvalidTokenize(r, "chat.tools_json: is not a JSON array");
  chat->set_tools_json("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]");
  chat->set_template_kwargs_json("nope");
  ExpectInvalidTokenize(r, "chat.template_kwargs_json: is not valid JSON");
  chat->set_template_kwargs_json("[]");
  ExpectInvalidTokenize(r, "chat.template_kwargs_json: is not a JSON object");
  chat->set_template_kwargs_json("{\"enable_thinking\": false}");
  EXPECT_TRUE(ValidateTokenizeRequest(r).ok());
}

// Messages reach the template as vLLM and transformers present them.
TEST(ToChatTemplateInput, PresentsMessagesAsTransformersDoes) {
  moe::v1::ChatMessages chat;
  auto* user = chat.add_messages();
  user->set_role("user");
  user->set_content("weather?");
  auto* assistant = chat.add_messages();
  assistant->set_role("assistant");
  assistant->set_reasoning_content("need a tool");
  moe::v1::ToolCall* call = assistant->add_tool_calls();
  call->set_id("c1");
  call->set_name("get_weather");
  call->set_arguments("{\"z\": 1, \"a\": [true]}");
  moe::v1::ToolCall* bare = assistant->add_tool_calls();
  bare->set_name("now");
  auto* tool = chat.add_messages();
  tool->set_role("tool");
  tool->set_content("sunny");
  tool->set_tool_call_id("c1");
  tool->set_name("get_weather");
  chat.set_template_kwargs_json("{\"enable_thinking\": false}");
  absl::StatusOr<ChatTemplateInput> in = ToChatTemplateInput(chat);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(
      in->messages.dump(),
      R"([{"role":"user","content":"weather?"},)"
      R"({"role":"assistant","content":"","reasoning_content":"need a tool","tool_calls":[)"
      R"({"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"z":1,"a":[true]}}},)"
      R"({"id":"","type":"function","function":{"name":"now","arguments":{}}}]},)"
      R"({"role":"tool","content":"sunny","tool_call_id":"c1","name":"get_weather"}])");
  EXPECT_TRUE(in->tools.is_null());
  EXPECT_EQ(in->kwargs.dump(), R"({"enable_thinking":false})");
  chat.set_tools_json("{}");
  EXPECT_EQ(ToChatTemplateInput(chat).status().message(), "chat.tools_json: is not a JSON array");
}

TEST(StatusConvert, CodesMapOneToOne) {
  for (int c = 0; c <= 16; ++c) {
    const absl::Status st(static_cast<absl::StatusCode>(c), c == 0 ? "" : "why");
    const grpc::Status g = ToGrpcStatus(st);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(FromGrpcStatus(g), st);
  }
  EXPECT_STREQ(CodeLabel(absl::StatusCode::kResourceExhausted), "resource_exhausted");
}

}  // namespace
}  // namespace moe::service
