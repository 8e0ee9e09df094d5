// ChatML rendering: the fixed structure every Qwen template produces for plain conversations.
#include "engine/tokenizer/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace moe::engine {
namespace {

constexpr absl::string_view kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

void AppendTurn(absl::string_view role, absl::string_view content, std::string* out) {
  absl::StrAppend(out, "<|im_start|>", role, "\n", content, "<|im_end|>\n");
}

absl::string_view StripLeft(absl::string_view s) {
  while (absl::ConsumePrefix(&s, "\n")) {
  }
  return s;
}
absl::string_view StripRight(absl::string_view s) {
  while (absl::ConsumeSuffix(&s, "\n")) {
  }
  return s;
}

// Index of the last user message that is a real query (not a wrapped tool response), as Qwen3's
// template computes `ns.last_query_index`; messages.size() - 1 when there is none.
size_t LastQueryIndex(absl::Span<const ChatMessage> messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    bool tool_response =
        absl::StartsWith(c, "<tool_response>") && absl::EndsWith(c, "</tool_response>");
    if (messages[i].role == "user" && !tool_response) return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

// Qwen3's assistant turn: reasoning before "</think>" is dropped from history, and the turns
// after the last query keep an (empty) <think> block when last or when they had reasoning.
void AppendQwen3Assistant(absl::string_view content, bool after_query, bool last,
                          std::string* out) {
  absl::string_view reasoning;
  if (size_t end = content.find("</think>"); end != absl::string_view::npos) {
    absl::string_view before = StripRight(content.substr(0, end));
    size_t start = before.rfind("<think>");
    reasoning = StripLeft(start == absl::string_view::npos ? before : before.substr(start + 7));
    content = StripLeft(content.substr(content.rfind("</think>") + 8));
  }
  if (after_query && (last || !reasoning.empty())) {
    absl::StrAppend(out, "<|im_start|>assistant\n<think>\n", StripLeft(StripRight(reasoning)),
                    "\n</think>\n\n", StripLeft(content), "<|im_end|>\n");
  } else {
    AppendTurn("assistant", content, out);
  }
}

}  // namespace

absl::StatusOr<std::string> RenderChat(const std::string& chat_template,
                                       absl::Span<const ChatMessage> messages,
                                       const ChatOptions& options) {
  if (!absl::StrContains(chat_template, "<|im_start|>")) {
    return absl::UnimplementedError(
        "chat template is not ChatML (no <|im_start|>); only ChatML templates are rendered");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role == "tool") {
      return absl::UnimplementedError(
          absl::StrCat("messages[", i, "]: role 'tool' is not rendered by this ChatML subset"));
    }
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: role '", role,
                                                     "' is not one of system, user, assistant"));
    }
  }
  std::string out;
  bool has_system = !messages.empty() && messages[0].role == "system";
  if (!has_system && absl::StrContains(chat_template, kQwen25DefaultSystem)) {
    AppendTurn("system", kQwen25DefaultSystem, &out);
  }
  // Qwen3's template is recognised by its handling of reasoning_content.
  const bool qwen3 = absl::StrContains(chat_template, "reasoning_content");
  const size_t last_query = LastQueryIndex(messages);
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (qwen3 && m.role == "assistant") {
      AppendQwen3Assistant(m.content, i > last_query, i + 1 == messages.size(), &out);
    } else {
      AppendTurn(m.role, m.content, &out);
    }
  }
  if (options.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!options.enable_thinking && absl::StrContains(chat_template, "enable_thinking")) {
      out += "<think>\n\n</think>\n\n";
    }
  }
  return out;
}

absl::StatusOr<std::string> RenderChat(const std::string& chat_template,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return RenderChat(chat_template, messages, options);
}

}  // namespace moe::engine
