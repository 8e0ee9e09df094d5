// Conversion of validated moe.v1 requests to engine parameters.
#include "service/proto_convert.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/proto_validate.h"

namespace moe::service {

engine::SamplingParams ToSamplingParams(const moe::v1::SamplingParams& s) {
  engine::SamplingParams p;
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_min_p()) p.min_p = s.min_p();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) p.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) p.seed = s.seed();
  return p;
}

engine::StopConditions ToStopConditions(const moe::v1::GenerateRequest& r, int64_t prompt_tokens,
                                        int64_t context_length) {
  engine::StopConditions stop;
  if (r.has_max_tokens()) {
    stop.max_tokens = r.max_tokens();
  } else {
    // The default never makes a valid prompt fail: it shrinks to what the context has left.
    stop.max_tokens =
        std::max<int64_t>(1, std::min<int64_t>(kDefaultMaxTokens, context_length - prompt_tokens));
  }
  stop.stop_strings.assign(r.stop().strings().begin(), r.stop().strings().end());
  stop.stop_token_ids.assign(r.stop().token_ids().begin(), r.stop().token_ids().end());
  stop.ignore_eos = r.stop().ignore_eos();
  return stop;
}

namespace {

absl::StatusOr<engine::TemplateJson> ParseJson(const std::string& field, const std::string& text,
                                               bool want_array) {
  engine::TemplateJson j = engine::TemplateJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || (want_array ? !j.is_array() : !j.is_object())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, want_array ? ": is not a JSON array" : ": is not a JSON object"));
  }
  return j;
}

}  // namespace

absl::StatusOr<ChatTemplateInput> ToChatTemplateInput(const moe::v1::ChatMessages& chat) {
  using engine::TemplateJson;
  ChatTemplateInput in{TemplateJson::array(), nullptr, TemplateJson::object()};
  for (int i = 0; i < chat.messages_size(); ++i) {
    const moe::v1::ChatMessage& m = chat.messages(i);
    TemplateJson msg = {{"role", m.role()}, {"content", m.content()}};
    if (!m.reasoning_content().empty()) msg["reasoning_content"] = m.reasoning_content();
    if (m.tool_calls_size() > 0) {
      TemplateJson calls = TemplateJson::array();
      for (int k = 0; k < m.tool_calls_size(); ++k) {
        const moe::v1::ToolCall& call = m.tool_calls(k);
        TemplateJson arguments = TemplateJson::object();
        if (!call.arguments().empty()) {
          absl::StatusOr<TemplateJson> parsed =
              ParseJson(absl::StrCat("chat.messages[", i, "].tool_calls[", k, "].arguments"),
                        call.arguments(), false);
          if (!parsed.ok()) return parsed.status();
          arguments = *std::move(parsed);
        }
        calls.push_back(
            {{"id", call.id()},
             {"type", "function"},
             {"function", {{"name", call.name()}, {"arguments", std::move(arguments)}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) msg["tool_call_id"] = m.tool_call_id();
    if (!m.name().empty()) msg["name"] = m.name();
    in.messages.push_back(std::move(msg));
  }
  if (!chat.tools_json().empty()) {
    absl::StatusOr<TemplateJson> tools = ParseJson("chat.tools_json", chat.tools_json(), true);
    if (!tools.ok()) return tools.status();
    in.tools = *std::move(tools);
  }
  if (!chat.template_kwargs_json().empty()) {
    absl::StatusOr<TemplateJson> kwargs =
        ParseJson("chat.template_kwargs_json", chat.template_kwargs_json(), false);
    if (!kwargs.ok()) return kwargs.status();
    in.kwargs = *std::move(kwargs);
  }
  return in;
}

}  // namespace moe::service
