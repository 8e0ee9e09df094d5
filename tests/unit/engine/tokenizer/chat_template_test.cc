// Tests of ChatTemplate (engine/tokenizer/chat_template.h): the render context and the built-in
// ChatML template. Real model templates are compared with @huggingface/jinja in
// tests/chat_template_js/.
#include "engine/tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace moe::engine {
namespace {

using ::testing::HasSubstr;
using Json = TemplateJson;

const Json kMessages = Json::parse(R"([{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi"}])");

TEST(ChatTemplateTest, BuiltInChatMl) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Compile(std::string(ChatMlTemplate()), "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t->Render(kMessages, nullptr, Json::object(), true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*t->Render(kMessages, nullptr, Json::object(), false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(*t->Render(Json::array(), nullptr, Json::object(), true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, ContextHasTokensToolsAndExtraVariables) {
  const std::string source =
      "{{ bos_token }}|{{ eos_token }}|{{ tools is defined }}|{{ tools | tojson if tools }}|"
      "{{ enable_thinking }}|{{ add_generation_prompt }}|{{ messages | length }}";
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Compile(source, "<s>", "</s>");
  ASSERT_TRUE(t.ok()) << t.status();
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(*t->Render(kMessages, tools, {{"enable_thinking", false}}, true),
            R"(<s>|</s>|True|[{"type": "function", "function": {"name": "f"}}]|False|True|2)");
  EXPECT_EQ(*t->Render(kMessages, nullptr, Json::object(), false), "<s>|</s>|False|||False|2");
  // A missing token (Qwen3 has no BOS) is undefined, as transformers leaves out a None token.
  absl::StatusOr<ChatTemplate> no_bos =
      ChatTemplate::Compile("{{ bos_token is defined }}", "", "e");
  EXPECT_EQ(*no_bos->Render(kMessages, nullptr, nullptr, true), "False");
}

TEST(ChatTemplateTest, ErrorsAreInvalidArgument) {
  absl::StatusOr<ChatTemplate> bad = ChatTemplate::Compile("{% if x %}", "", "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("line 1, column 1"));
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Compile(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
      "", "");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = t->Render(kMessages, nullptr, nullptr, true);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "first must be user");
  EXPECT_THAT(t->Render(kMessages, nullptr, {{"messages", 1}}, true).status().message(),
              HasSubstr("'messages' is set by the request"));
  EXPECT_THAT(t->Render(kMessages, nullptr, Json::array(), true).status().message(),
              HasSubstr("not an object"));
}

TEST(ChatTemplateTest, PromptOpensThinking) {
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>"));
  EXPECT_TRUE(PromptOpensThinking("x<think>  \n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
  EXPECT_FALSE(PromptOpensThinking(""));
}

}  // namespace
}  // namespace moe::engine
