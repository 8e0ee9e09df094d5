// Tests of RenderChat (engine/tokenizer/chat_template.h). Expected strings were rendered from the
// real Qwen3 template with Python jinja2 3.1.
#include "engine/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace moe::engine {
namespace {

using ::testing::HasSubstr;

// Stand-ins carrying the markers RenderChat keys on; the Jinja bodies are not interpreted.
const std::string kChatMl = "{% for m in messages %}<|im_start|>...{% endfor %}";
const std::string kQwen3 =
    "<|im_start|> ... reasoning_content ... enable_thinking is defined and enable_thinking is "
    "false";
const std::string kQwen25 =
    "<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

TEST(RenderChatTest, ChatMl) {
  std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(*RenderChat(kChatMl, msgs, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*RenderChat(kChatMl, msgs, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(*RenderChat(kChatMl, {}, true), "<|im_start|>assistant\n");
}

TEST(RenderChatTest, EnableThinkingFalseOnlyWhereTheTemplateHasIt) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  ChatOptions no_think;
  no_think.enable_thinking = false;
  EXPECT_EQ(*RenderChat(kQwen3, msgs, no_think),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(*RenderChat(kChatMl, msgs, no_think),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(RenderChatTest, Qwen3StripsReasoningFromHistory) {
  std::vector<ChatMessage> msgs = {{"user", "Q1"},
                                   {"assistant", "<think>\nr1\n</think>\n\nA1"},
                                   {"user", "Q2"},
                                   {"assistant", "A2"}};
  EXPECT_EQ(*RenderChat(kQwen3, msgs, false),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA2"
            "<|im_end|>\n");
  std::vector<ChatMessage> after = {
      {"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"assistant", "A2"}};
  EXPECT_EQ(*RenderChat(kQwen3, after, false),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\nA1"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n");
}

TEST(RenderChatTest, Qwen25DefaultSystemPrompt) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  EXPECT_EQ(*RenderChat(kQwen25, msgs, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(RenderChatTest, Errors) {
  std::vector<ChatMessage> msgs = {{"user", "Hi"}};
  absl::StatusOr<std::string> r = RenderChat("{{ bos_token }}[INST] ...", msgs, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(r.status().message(), HasSubstr("ChatML"));
  r = RenderChat(kChatMl, std::vector<ChatMessage>{{"user", "a"}, {"robot", "b"}}, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("messages[1]"));
  r = RenderChat(kChatMl, std::vector<ChatMessage>{{"tool", "{}"}}, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace moe::engine
