// OutputSplitter: a small state machine over the text not yet returned (buffer_).
#include "service/http/output_splitter.h"

#include <algorithm>
#include <array>

#include "nlohmann/json.hpp"

namespace moe::service::http {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";

// Length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

std::string_view Trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

OutputSplitter::OutputSplitter(bool in_thinking, bool parse_tools)
    : mode_(in_thinking ? Mode::kThinking : Mode::kContent), parse_tools_(parse_tools) {}

bool OutputSplitter::ParseCall(std::string_view text, ParsedToolCall* call) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  call->name = j["name"].get<std::string>();
  if (call->name.empty()) return false;
  const char* key = j.contains("arguments") ? "arguments" : "parameters";
  if (!j.contains(key)) {
    call->arguments = "{}";
  } else if (j[key].is_object()) {
    call->arguments = j[key].dump();
  } else if (j[key].is_string()) {
    // Some models write the arguments as JSON text already; it must be an object.
    const nlohmann::json inner = nlohmann::json::parse(j[key].get<std::string>(), nullptr, false);
    if (!inner.is_object()) return false;
    call->arguments = inner.dump();
  } else {
    return false;
  }
  return true;
}

void OutputSplitter::Emit(OutputPiece::Kind kind, std::string_view text,
                          std::vector<OutputPiece>* out) {
  if (kind == OutputPiece::Kind::kContent && skip_space_) {
    text = text.substr(std::min(text.size(), text.find_first_not_of(" \t\r\n")));
    if (!text.empty()) skip_space_ = false;
  }
  if (text.empty()) return;
  if (!out->empty() && out->back().kind == kind && kind != OutputPiece::Kind::kToolCall) {
    out->back().text.append(text);
    return;
  }
  out->push_back(OutputPiece{kind, std::string(text), {}});
}

void OutputSplitter::Drain(bool final, std::vector<OutputPiece>* out) {
  using Kind = OutputPiece::Kind;
  for (;;) {
    switch (mode_) {
      case Mode::kContent: {
        std::array<std::string_view, 3> tags = {kThinkOpen, kHermesOpen, kMistralOpen};
        const size_t num_tags = parse_tools_ ? 3 : 1;
        size_t best = std::string::npos, which = 0;
        for (size_t i = 0; i < num_tags; ++i) {
          const size_t at = buffer_.find(tags[i]);
          if (at < best) best = at, which = i;
        }
        if (best != std::string::npos) {
          Emit(Kind::kContent, std::string_view(buffer_).substr(0, best), out);
          buffer_.erase(0, best + tags[which].size());
          mode_ = which == 0   ? Mode::kThinking
                  : which == 1 ? Mode::kHermesCall
                               : Mode::kMistralCalls;
          continue;
        }
        size_t hold = 0;
        if (!final) {
          for (size_t i = 0; i < num_tags; ++i) hold = std::max(hold, PartialTag(buffer_, tags[i]));
        }
        Emit(Kind::kContent, std::string_view(buffer_).substr(0, buffer_.size() - hold), out);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case Mode::kThinking: {
        const size_t at = buffer_.find(kThinkClose);
        if (at != std::string::npos) {
          Emit(Kind::kReasoning, std::string_view(buffer_).substr(0, at), out);
          buffer_.erase(0, at + kThinkClose.size());
          // The template's "</think>\n\n" separator is not part of the answer.
          skip_space_ = true;
          mode_ = Mode::kContent;
          continue;
        }
        const size_t hold = final ? 0 : PartialTag(buffer_, kThinkClose);
        Emit(Kind::kReasoning, std::string_view(buffer_).substr(0, buffer_.size() - hold), out);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case Mode::kHermesCall: {
        const size_t at = buffer_.find(kHermesClose);
        if (at == std::string::npos) {
          if (final) {  // never closed: the text as generated
            Emit(Kind::kContent, std::string(kHermesOpen) + buffer_, out);
            buffer_.clear();
          }
          return;
        }
        ParsedToolCall call;
        if (ParseCall(Trim(std::string_view(buffer_).substr(0, at)), &call)) {
          out->push_back(OutputPiece{Kind::kToolCall, {}, std::move(call)});
          ++tool_calls_;
          skip_space_ = true;
        } else {
          Emit(Kind::kContent,
               std::string(kHermesOpen) + buffer_.substr(0, at) + std::string(kHermesClose), out);
        }
        buffer_.erase(0, at + kHermesClose.size());
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kMistralCalls: {
        // No closing tag: the array ends the output. Parse once it is complete JSON.
        const std::string_view body = Trim(buffer_);
        const bool complete = !body.empty() && (body.back() == ']' || body.back() == '}') &&
                              nlohmann::json::accept(body);
        if (!complete && !final) return;
        std::vector<ParsedToolCall> calls;
        bool ok = complete;
        if (ok) {
          nlohmann::json j = nlohmann::json::parse(body);
          if (j.is_object()) j = nlohmann::json::array({j});
          ok = j.is_array() && !j.empty();
          for (size_t i = 0; ok && i < j.size(); ++i) {
            ParsedToolCall call;
            ok = ParseCall(j[i].dump(), &call);
            calls.push_back(std::move(call));
          }
        }
        if (ok) {
          for (ParsedToolCall& call : calls) {
            out->push_back(OutputPiece{Kind::kToolCall, {}, std::move(call)});
            ++tool_calls_;
          }
          skip_space_ = true;
        } else {
          Emit(Kind::kContent, std::string(kMistralOpen) + buffer_, out);
        }
        buffer_.clear();
        mode_ = Mode::kContent;
        return;
      }
    }
  }
}

std::vector<OutputPiece> OutputSplitter::Push(std::string_view text) {
  buffer_.append(text);
  std::vector<OutputPiece> out;
  Drain(/*final=*/false, &out);
  return out;
}

std::vector<OutputPiece> OutputSplitter::Finish() {
  std::vector<OutputPiece> out;
  Drain(/*final=*/true, &out);
  return out;
}

}  // namespace moe::service::http
