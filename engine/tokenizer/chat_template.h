// ChatTemplate: a model's Jinja chat template, compiled once, rendering messages to prompt text.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/jinja.h"

namespace moe::engine {

// The template for checkpoints that ship none, in Jinja (rendered like any other):
//   <|im_start|>{role}\n{content}<|im_end|>\n   per message, then <|im_start|>assistant\n
absl::string_view ChatMlTemplate();

class ChatTemplate {
 public:
  // Parses `source`; InvalidArgument "line L, column C: ..." when it does not parse. An empty
  // bos/eos token is left out of the render context (as transformers leaves out a None token).
  static absl::StatusOr<ChatTemplate> Compile(std::string source, std::string bos_token,
                                              std::string eos_token);

  // Renders with the variables transformers gives a chat template: `messages` (an array of
  // {"role", "content", ...} objects), `tools` (only when not null), `add_generation_prompt`,
  // `bos_token`, `eos_token`, and every key of `extra` (an object, e.g. {"enable_thinking": false};
  // it may not set messages, tools or add_generation_prompt).
  // InvalidArgument: a runtime error of the template (raise_exception's message, wrong types),
  // `extra` not an object or setting a reserved name.
  //
  // Content is inserted verbatim: special-token text inside a message survives into the prompt.
  absl::StatusOr<std::string> Render(const TemplateJson& messages, const TemplateJson& tools,
                                     const TemplateJson& extra, bool add_generation_prompt) const;

  const std::string& source() const { return source_; }

 private:
  explicit ChatTemplate(JinjaTemplate t) : template_(std::move(t)) {}
  JinjaTemplate template_;
  std::string source_, bos_token_, eos_token_;
};

// True when `prompt` ends inside an open <think> block: after trimming trailing whitespace it
// ends with "<think>" (the template opened the model's reasoning for it).
bool PromptOpensThinking(absl::string_view prompt);

}  // namespace moe::engine
