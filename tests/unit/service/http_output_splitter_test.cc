// OutputSplitter on each family's documented output: Qwen3 / Hermes <tool_call> blocks, Mistral
// [TOOL_CALLS] arrays, <think> reasoning; fed whole, and one byte at a time (tags cut anywhere).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/http/output_splitter.h"

namespace moe::service::http {
namespace {

using Kind = OutputPiece::Kind;

// A readable trace: "R:text", "C:text", "T:name args".
std::vector<std::string> Trace(const std::vector<OutputPiece>& pieces) {
  std::vector<std::string> out;
  for (const OutputPiece& p : pieces) {
    std::string s = p.kind == Kind::kReasoning ? "R:" + p.text
                    : p.kind == Kind::kContent ? "C:" + p.text
                                               : "T:" + p.call.name + " " + p.call.arguments;
    // Merge what streaming split into several pieces of the same kind.
    if (!out.empty() && p.kind != Kind::kToolCall && out.back()[0] == s[0] && s[0] != 'T') {
      out.back() += s.substr(2);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

std::vector<std::string> Split(const std::string& text, size_t chunk, bool in_thinking = false,
                               bool tools = true) {
  OutputSplitter s(in_thinking, tools);
  std::vector<OutputPiece> all;
  for (size_t i = 0; i < text.size(); i += chunk) {
    for (OutputPiece& p : s.Push(text.substr(i, chunk))) all.push_back(std::move(p));
  }
  for (OutputPiece& p : s.Finish()) all.push_back(std::move(p));
  return Trace(all);
}

// Every chunk size gives the same answer.
void ExpectSplit(const std::string& text, const std::vector<std::string>& want,
                 bool in_thinking = false, bool tools = true) {
  for (size_t chunk : {text.size() + 1, size_t{1}, size_t{2}, size_t{3}, size_t{7}}) {
    EXPECT_EQ(Split(text, chunk, in_thinking, tools), want) << "chunk " << chunk;
  }
}

TEST(OutputSplitter, PlainText) {
  ExpectSplit("Hello <b>world</b> [x]", {"C:Hello <b>world</b> [x]"});
}

TEST(OutputSplitter, HermesQwenOneCall) {
  // Qwen2.5 / Qwen3 / Hermes 2 Pro tool-call format (the chat templates' own example).
  ExpectSplit(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>",
      {"T:get_weather {\"city\":\"Paris\"}"});
}

TEST(OutputSplitter, HermesTextThenSeveralCalls) {
  ExpectSplit(
      "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>\n",
      {"C:Let me check.\n", "T:a {}", "T:b {\"x\":[1,2]}"});
}

TEST(OutputSplitter, MalformedHermesCallIsText) {
  const std::string bad = "<tool_call>\n{\"name\": \"a\", \"arguments\": {oops}\n</tool_call>";
  ExpectSplit(bad, {"C:" + bad});
  ExpectSplit("<tool_call>{\"arguments\": {}}</tool_call>",
              {"C:<tool_call>{\"arguments\": {}}</tool_call>"});                      // no name
  ExpectSplit("<tool_call>\n{\"name\": \"a\"", {"C:<tool_call>\n{\"name\": \"a\""});  // unclosed
}

TEST(OutputSplitter, MistralCalls) {
  // Mistral v3 tokenizer format: [TOOL_CALLS] then a JSON array of calls.
  ExpectSplit(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
      "{\"name\": \"noop\", \"arguments\": {}}]",
      {"T:get_weather {\"city\":\"Paris\"}", "T:noop {}"});
  ExpectSplit("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"]\"}}]",
              {"T:f {\"a\":\"]\"}"});
  ExpectSplit("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": ",
              {"C:[TOOL_CALLS][{\"name\": \"f\", \"arguments\": "});
}

TEST(OutputSplitter, ToolMarkupIsTextWithoutTools) {
  const std::string text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>";
  ExpectSplit(text, {"C:" + text}, /*in_thinking=*/false, /*tools=*/false);
}

TEST(OutputSplitter, Reasoning) {
  ExpectSplit("<think>\nI should greet.\n</think>\n\nHello!",
              {"R:\nI should greet.\n", "C:Hello!"});
  // The template opened the block: reasoning from the start up to </think>.
  ExpectSplit("I should greet.</think>\n\nHello!", {"R:I should greet.", "C:Hello!"},
              /*in_thinking=*/true);
  // Never closed (max_tokens): all reasoning.
  ExpectSplit("<think>still thinking <", {"R:still thinking <"});
}

TEST(OutputSplitter, ReasoningThenToolCall) {
  ExpectSplit(
      "<think>need weather</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      {"R:need weather", "T:get_weather {\"city\":\"Paris\"}"});
}

TEST(OutputSplitter, HoldsBackOnlyAPossibleTag) {
  OutputSplitter s(false, true);
  std::vector<std::string> got = Trace(s.Push("a <to"));
  EXPECT_EQ(got, (std::vector<std::string>{"C:a "}));
  got = Trace(s.Push("ken"));  // not a tag after all
  EXPECT_EQ(got, (std::vector<std::string>{"C:<token"}));
  got = Trace(s.Push(" [TOOL"));
  EXPECT_EQ(got, (std::vector<std::string>{"C: "}));
  got = Trace(s.Finish());
  EXPECT_EQ(got, (std::vector<std::string>{"C:[TOOL"}));
  EXPECT_FALSE(s.saw_tool_call());
}

}  // namespace
}  // namespace moe::service::http
