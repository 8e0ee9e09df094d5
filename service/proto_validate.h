// moe.v1 request validation: every error names the proto field. No engine types, so the
// frontend checks requests before admission with the same rules the worker applies.
#pragma once

#include <cstdint>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "moe/v1/moe.pb.h"

namespace moe::service {

// What validation needs to know about the model. A zero field is not checked (unknown).
struct ModelLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
};

inline constexpr uint32_t kMaxTopLogprobs = 20;
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr size_t kMaxIdBytes = 128;  // request_id, session_id
inline constexpr int64_t kDefaultMaxTokens = 256;

// Checks everything that does not need the tokenizer. InvalidArgument with the field path and
// the reason, e.g. "sampling.top_p: 1.5 is outside (0, 1]". Prompts given as text or chat are
// checked against the context length by the worker after tokenization.
absl::Status ValidateGenerateRequest(const moe::v1::GenerateRequest& request,
                                     const ModelLimits& limits);

// The shared fields of TokenizeRequest, checked as ValidateGenerateRequest checks them: model,
// a non-empty text, chat messages with a role and no empty user turn, tool calls with a name and
// JSON-object arguments, tools_json a JSON array and template_kwargs_json a JSON object.
absl::Status ValidateTokenizeRequest(const moe::v1::TokenizeRequest& request);

// For bytes that failed to parse as a `message`: the path of the first string field (at any
// depth, e.g. "chat.messages[1].content") whose bytes are not valid UTF-8, which proto3 refuses.
// Empty when there is none (the bytes are broken some other way).
std::string InvalidUtf8Field(const google::protobuf::Descriptor& message, absl::string_view bytes);

// True when `bytes` is well-formed UTF-8 (Unicode Table 3-7: no overlong forms, no surrogates,
// nothing above U+10FFFF): what proto3 requires of string fields.
bool IsValidUtf8(absl::string_view bytes);

}  // namespace moe::service
