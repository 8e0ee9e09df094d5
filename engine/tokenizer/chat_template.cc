// ChatTemplate: the render context transformers builds, around JinjaTemplate.
#include "engine/tokenizer/chat_template.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace moe::engine {

absl::string_view ChatMlTemplate() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' "
         "}}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

absl::StatusOr<ChatTemplate> ChatTemplate::Compile(std::string source, std::string bos_token,
                                                   std::string eos_token) {
  absl::StatusOr<JinjaTemplate> t = JinjaTemplate::Parse(source);
  if (!t.ok()) return t.status();
  ChatTemplate chat(*std::move(t));
  chat.source_ = std::move(source);
  chat.bos_token_ = std::move(bos_token);
  chat.eos_token_ = std::move(eos_token);
  return chat;
}

absl::StatusOr<std::string> ChatTemplate::Render(const TemplateJson& messages,
                                                 const TemplateJson& tools,
                                                 const TemplateJson& extra,
                                                 bool add_generation_prompt) const {
  TemplateJson context = TemplateJson::object();
  context["messages"] = messages;
  if (!tools.is_null()) context["tools"] = tools;
  context["add_generation_prompt"] = add_generation_prompt;
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  if (!extra.is_null()) {
    if (!extra.is_object()) return absl::InvalidArgumentError("template variables: not an object");
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools" || it.key() == "add_generation_prompt") {
        return absl::InvalidArgumentError(
            absl::StrCat("template variables: '", it.key(), "' is set by the request itself"));
      }
      context[it.key()] = it.value();
    }
  }
  return template_.Render(context);
}

bool PromptOpensThinking(absl::string_view prompt) {
  return absl::EndsWith(absl::StripTrailingAsciiWhitespace(prompt), "<think>");
}

}  // namespace moe::engine
