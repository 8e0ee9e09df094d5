// OutputSplitter: the model's generated text -> reasoning, content and tool calls, incrementally
// (text arrives in stream chunks that may cut a tag anywhere).
//
//   <think>...</think>                      reasoning (or from the start when the prompt opened
//                                           the block: prompt_opens_thinking)
//   <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>   Qwen / Hermes, one or several
//   [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]           Mistral (to the end of output)
//
// Only a suffix that may be the start of a tag is held back; everything else is returned at
// once. A tool call whose JSON does not parse (or lacks "name") comes back as content, the text
// exactly as generated. Whitespace between or after tool calls is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace moe::service::http {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text of an object ("{}" when absent)
};

struct OutputPiece {
  enum class Kind { kReasoning, kContent, kToolCall };
  Kind kind;
  std::string text;     // kReasoning, kContent
  ParsedToolCall call;  // kToolCall
};

class OutputSplitter {
 public:
  // in_thinking: the prompt ended inside <think> (GenerateResponse.prompt_opens_thinking).
  // parse_tools: recognise tool-call markup (the request offered tools); otherwise it is content.
  OutputSplitter(bool in_thinking, bool parse_tools);

  // Appends generated text; returns what is now certain, in order (adjacent pieces of the same
  // kind merged).
  std::vector<OutputPiece> Push(std::string_view text);
  // The output ended: whatever was held back (an unterminated tool call is content; an
  // unterminated <think> block is reasoning).
  std::vector<OutputPiece> Finish();

  bool saw_tool_call() const { return tool_calls_ > 0; }

 private:
  enum class Mode { kContent, kThinking, kHermesCall, kMistralCalls };
  void Emit(OutputPiece::Kind kind, std::string_view text, std::vector<OutputPiece>* out);
  // Consumes buffer_ as far as is certain; `final`: no more text will come.
  void Drain(bool final, std::vector<OutputPiece>* out);
  // Parses one call object; false when it is not {"name": string, "arguments": object|string}.
  static bool ParseCall(std::string_view json, ParsedToolCall* call);

  Mode mode_;
  const bool parse_tools_;
  std::string buffer_;  // text not yet returned
  int tool_calls_ = 0;
  bool skip_space_ = false;  // drop whitespace until the next non-space content (after a
                             // tool call or </think>)
};

}  // namespace moe::service::http
