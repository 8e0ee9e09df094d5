// Conversion of moe.v1 requests, once validated (proto_validate.h), to engine types. The
// worker's half: the frontend never builds engine parameters.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/sampler.h"
#include "engine/stop.h"
#include "engine/tokenizer/jinja.h"
#include "moe/v1/moe.pb.h"

namespace moe::service {

// Unset fields take the defaults documented in moe.proto (and engine/sampler.h).
engine::SamplingParams ToSamplingParams(const moe::v1::SamplingParams& sampling);

// `prompt_tokens` decides the default max_tokens: min(kDefaultMaxTokens, context - prompt).
engine::StopConditions ToStopConditions(const moe::v1::GenerateRequest& request,
                                        int64_t prompt_tokens, int64_t context_length);

// A chat request as the chat template sees it, the way vLLM and transformers present messages:
// {"role", "content"}, plus "reasoning_content" when non-empty, "tool_calls":
// [{"id", "type": "function", "function": {"name", "arguments": <the parsed object>}}] when there
// are calls (empty arguments are {}), and "tool_call_id" and "name" when set (tool turns).
struct ChatTemplateInput {
  engine::TemplateJson messages;  // array
  engine::TemplateJson tools;     // array, or null when tools_json is empty
  engine::TemplateJson kwargs;    // object (empty when template_kwargs_json is)
};
// InvalidArgument naming the field when a JSON field does not parse as ValidateChat requires.
absl::StatusOr<ChatTemplateInput> ToChatTemplateInput(const moe::v1::ChatMessages& chat);

}  // namespace moe::service
