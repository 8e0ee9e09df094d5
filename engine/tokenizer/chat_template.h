// RenderChat: messages -> prompt text for ChatML-family chat templates (Qwen), without Jinja.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moe::engine {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct ChatOptions {
  // Append "<|im_start|>assistant\n" so the model answers next.
  bool add_generation_prompt = true;
  // false: after the generation prompt, append the empty thinking block
  // "<think>\n\n</think>\n\n" -- only when the template itself checks `enable_thinking` (Qwen3).
  bool enable_thinking = true;
};

// Renders `messages` the way the ChatML templates of Qwen2/2.5/3 do:
//   <|im_start|>{role}\n{content}<|im_end|>\n      for every message, in order
//   <|im_start|>assistant\n                          with add_generation_prompt
//   <think>\n\n</think>\n\n                          with enable_thinking false (Qwen3 only)
// A template is ChatML when it contains "<|im_start|>". When it has Qwen2.5's default system
// prompt ("You are Qwen, created by Alibaba Cloud. ...") and the first message is not a system
// message, that system message is prepended, as the template does.
// Qwen3 (template mentions reasoning_content): assistant turns lose the "<think>...</think>"
// reasoning their content carries, except turns after the last user query that are last or had
// reasoning, which are written "<think>\n{reasoning}\n</think>\n\n{answer}", as Qwen3 does.
// Not rendered (the caller must not rely on them): tools and tool calls, the "tool" role, a
// separate reasoning_content field, any other Jinja logic.
//
// Content is inserted verbatim: special-token text inside a message survives into the prompt,
// so encode untrusted content separately with allow_special = false when that matters.
//
// Unimplemented: a template that is not ChatML (the message says so), or a "tool" message.
// InvalidArgument: any other role that is not system/user/assistant, naming the message index.
absl::StatusOr<std::string> RenderChat(const std::string& chat_template,
                                       absl::Span<const ChatMessage> messages,
                                       const ChatOptions& options);

// Same with default options except `add_generation_prompt`.
absl::StatusOr<std::string> RenderChat(const std::string& chat_template,
                                       absl::Span<const ChatMessage> messages,
                                       bool add_generation_prompt);

}  // namespace moe::engine
