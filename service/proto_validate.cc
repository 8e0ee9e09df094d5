// Validation of moe.v1 requests.
#include "service/proto_validate.h"

#include <cmath>

#include <map>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "nlohmann/json.hpp"

namespace moe::service {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// NaN and infinities pass naive range checks (NaN compares false), so finiteness comes first.
absl::Status CheckFloat(absl::string_view field, float value, float lo, float hi, bool lo_open,
                        absl::string_view range) {
  if (!std::isfinite(value)) return Bad(field, absl::StrCat(value, " is not a finite number"));
  if (value < lo || (lo_open && value == lo) || value > hi) {
    return Bad(field, absl::StrCat(value, " is outside ", range));
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const moe::v1::SamplingParams& s) {
  if (s.has_temperature()) {
    if (!std::isfinite(s.temperature())) {
      return Bad("sampling.temperature", absl::StrCat(s.temperature(), " is not a finite number"));
    }
    if (s.temperature() < 0) {
      return Bad("sampling.temperature", absl::StrCat(s.temperature(), " is negative"));
    }
  }
  if (s.has_top_k() && s.top_k() < 0) {
    return Bad("sampling.top_k", absl::StrCat(s.top_k(), " is negative (0 turns it off)"));
  }
  if (s.has_top_p()) {
    absl::Status st = CheckFloat("sampling.top_p", s.top_p(), 0.f, 1.f, true, "(0, 1]");
    if (!st.ok()) return st;
  }
  if (s.has_min_p()) {
    absl::Status st = CheckFloat("sampling.min_p", s.min_p(), 0.f, 1.f, false, "[0, 1]");
    if (!st.ok()) return st;
  }
  if (s.has_repetition_penalty()) {
    absl::Status st = CheckFloat("sampling.repetition_penalty", s.repetition_penalty(), 0.f, 1e6f,
                                 true, "(0, 1e6]");
    if (!st.ok()) return st;
  }
  if (s.has_presence_penalty()) {
    absl::Status st =
        CheckFloat("sampling.presence_penalty", s.presence_penalty(), -2.f, 2.f, false, "[-2, 2]");
    if (!st.ok()) return st;
  }
  if (s.has_frequency_penalty()) {
    absl::Status st = CheckFloat("sampling.frequency_penalty", s.frequency_penalty(), -2.f, 2.f,
                                 false, "[-2, 2]");
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ValidateModel(const std::string& model) {
  if (model.empty()) return Bad("model", "is required (see ListModels)");
  return absl::OkStatus();
}

absl::Status ValidateText(const std::string& text) {
  if (text.empty()) return Bad("text", "the prompt is empty");
  return absl::OkStatus();
}

// OK when `text` parses as a JSON array (want_array) or object; else the reason, naming `field`.
absl::Status CheckJson(const std::string& field, const std::string& text, bool want_array) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(field, "is not valid JSON");
  if (want_array ? !j.is_array() : !j.is_object()) {
    return Bad(field, want_array ? "is not a JSON array" : "is not a JSON object");
  }
  return absl::OkStatus();
}

absl::Status ValidateChat(const moe::v1::ChatMessages& chat) {
  const auto& msgs = chat.messages();
  if (msgs.empty()) return Bad("chat.messages", "at least one message is required");
  for (int i = 0; i < msgs.size(); ++i) {
    const std::string at = absl::StrCat("chat.messages[", i, "]");
    if (msgs[i].role().empty()) return Bad(at + ".role", "is empty");
    // A user turn with nothing in it asks nothing (system, assistant and tool turns may be empty).
    if (msgs[i].role() == "user" && msgs[i].content().empty()) {
      return Bad(at + ".content", "a user turn is empty");
    }
    for (int k = 0; k < msgs[i].tool_calls_size(); ++k) {
      const moe::v1::ToolCall& call = msgs[i].tool_calls(k);
      const std::string call_at = absl::StrCat(at, ".tool_calls[", k, "]");
      if (call.name().empty()) return Bad(call_at + ".name", "is required");
      if (!call.arguments().empty()) {
        absl::Status st = CheckJson(call_at + ".arguments", call.arguments(), false);
        if (!st.ok()) return st;
      }
    }
  }
  if (!chat.tools_json().empty()) {
    absl::Status st = CheckJson("chat.tools_json", chat.tools_json(), true);
    if (!st.ok()) return st;
  }
  if (!chat.template_kwargs_json().empty()) {
    absl::Status st = CheckJson("chat.template_kwargs_json", chat.template_kwargs_json(), false);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status ValidateInput(const moe::v1::GenerateRequest& r, const ModelLimits& limits) {
  switch (r.input_case()) {
    case moe::v1::GenerateRequest::INPUT_NOT_SET:
      return Bad("input", "one of text, chat or token_ids is required");
    case moe::v1::GenerateRequest::kText:
      return ValidateText(r.text());
    case moe::v1::GenerateRequest::kChat:
      return ValidateChat(r.chat());
    case moe::v1::GenerateRequest::kTokenIds: {
      const auto& ids = r.token_ids().ids();
      if (ids.empty()) return Bad("token_ids.ids", "the prompt is empty");
      if (limits.vocab_size > 0) {
        for (int i = 0; i < ids.size(); ++i) {
          if (static_cast<int64_t>(ids[i]) >= limits.vocab_size) {
            return Bad(absl::StrCat("token_ids.ids[", i, "]"),
                       absl::StrCat(ids[i], " is outside the vocabulary (vocab_size ",
                                    limits.vocab_size, ")"));
          }
        }
      }
      if (limits.context_length > 0 && ids.size() >= limits.context_length) {
        return Bad("token_ids.ids",
                   absl::StrCat("the prompt has ", ids.size(), " tokens; the context length is ",
                                limits.context_length,
                                " (prompt + at least one generated token must fit)"));
      }
      return absl::OkStatus();
    }
  }
  return Bad("input", "unknown input kind");
}

}  // namespace

absl::Status ValidateGenerateRequest(const moe::v1::GenerateRequest& r, const ModelLimits& limits) {
  if (absl::Status st = ValidateModel(r.model()); !st.ok()) return st;
  if (absl::Status st = ValidateInput(r, limits); !st.ok()) return st;
  if (absl::Status st = ValidateSampling(r.sampling()); !st.ok()) return st;
  if (r.has_max_tokens()) {
    if (r.max_tokens() == 0) return Bad("max_tokens", "must be at least 1");
    if (limits.context_length > 0 && r.max_tokens() >= limits.context_length) {
      return Bad("max_tokens", absl::StrCat(r.max_tokens(), " is not below the context length ",
                                            limits.context_length));
    }
    if (limits.context_length > 0 && r.has_token_ids() &&
        r.token_ids().ids_size() + int64_t{r.max_tokens()} > limits.context_length) {
      return Bad(
          "max_tokens",
          absl::StrCat("prompt (", r.token_ids().ids_size(), " tokens) + max_tokens (",
                       r.max_tokens(), ") is over the context length ", limits.context_length));
    }
  }
  if (r.stop().strings_size() > kMaxStopStrings) {
    return Bad("stop.strings",
               absl::StrCat(r.stop().strings_size(), " strings; at most ", kMaxStopStrings));
  }
  for (int i = 0; i < r.stop().strings_size(); ++i) {
    const std::string& s = r.stop().strings(i);
    if (s.empty() || s.size() > kMaxStopStringBytes) {
      return Bad(absl::StrCat("stop.strings[", i, "]"),
                 absl::StrCat("must have 1 to ", kMaxStopStringBytes, " bytes"));
    }
  }
  if (limits.vocab_size > 0) {
    for (int i = 0; i < r.stop().token_ids_size(); ++i) {
      if (static_cast<int64_t>(r.stop().token_ids(i)) >= limits.vocab_size) {
        return Bad(absl::StrCat("stop.token_ids[", i, "]"),
                   absl::StrCat(r.stop().token_ids(i), " is outside the vocabulary (vocab_size ",
                                limits.vocab_size, ")"));
      }
    }
  }
  if (r.top_logprobs() > kMaxTopLogprobs) {
    return Bad("top_logprobs", absl::StrCat(r.top_logprobs(), " is over ", kMaxTopLogprobs));
  }
  if (r.session_id().size() > kMaxIdBytes) {
    return Bad("session_id", absl::StrCat("is over ", kMaxIdBytes, " bytes"));
  }
  if (r.request_id().size() > kMaxIdBytes) {
    return Bad("request_id", absl::StrCat("is over ", kMaxIdBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTokenizeRequest(const moe::v1::TokenizeRequest& r) {
  if (absl::Status st = ValidateModel(r.model()); !st.ok()) return st;
  switch (r.input_case()) {
    case moe::v1::TokenizeRequest::INPUT_NOT_SET:
      return Bad("input", "one of text or chat is required");
    case moe::v1::TokenizeRequest::kText:
      return ValidateText(r.text());
    case moe::v1::TokenizeRequest::kChat:
      return ValidateChat(r.chat());
  }
  return Bad("input", "unknown input kind");
}

bool IsValidUtf8(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t lead = static_cast<uint8_t>(bytes[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    int length;
    uint8_t lo = 0x80, hi = 0xBF;  // the second byte's allowed range
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) lo = 0xA0;  // overlong
      if (lead == 0xED) hi = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) lo = 0x90;  // overlong
      if (lead == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (bytes.size() - i < static_cast<size_t>(length)) return false;
    for (int k = 1; k < length; ++k) {
      const uint8_t b = static_cast<uint8_t>(bytes[i + k]);
      if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
    }
    i += length;
  }
  return true;
}

std::string InvalidUtf8Field(const google::protobuf::Descriptor& message,
                             absl::string_view bytes) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  std::map<int, int> seen;  // field number -> occurrences so far (the index of a repeated one)
  while (const uint32_t tag = in.ReadTag()) {
    const FieldDescriptor* field =
        message.FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    const bool nested = field != nullptr &&
                        WireFormatLite::GetTagWireType(tag) ==
                            WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
                        (field->type() == FieldDescriptor::TYPE_STRING ||
                         field->type() == FieldDescriptor::TYPE_MESSAGE);
    if (!nested) {
      if (!WireFormatLite::SkipField(&in, tag)) return "";
      continue;
    }
    uint32_t length = 0;
    std::string value;
    if (!in.ReadVarint32(&length) || !in.ReadString(&value, static_cast<int>(length))) return "";
    const int index = seen[field->number()]++;
    std::string path(field->name());
    if (field->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!IsValidUtf8(value)) return path;
    } else if (std::string inner = InvalidUtf8Field(*field->message_type(), value);
               !inner.empty()) {
      return absl::StrCat(path, ".", inner);
    }
  }
  return "";
}

}  // namespace moe::service
