// Fuzz target: engine::RenderChat. Input, split at NUL bytes: the chat template, then
// (role, content) pairs. Rendered text must contain every message's content verbatim.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moe;
  std::vector<std::string> parts = fuzz::SplitInput(data, size, 17);
  while (!parts.empty() && parts.back().empty()) parts.pop_back();
  if (parts.empty()) return 0;
  std::vector<engine::ChatMessage> messages;
  for (size_t i = 1; i + 1 < parts.size(); i += 2) messages.push_back({parts[i], parts[i + 1]});
  const uint8_t flags = size > 0 ? data[size - 1] : 0;
  engine::ChatOptions options;
  options.add_generation_prompt = flags & 1;
  options.enable_thinking = flags & 2;
  auto text = engine::RenderChat(parts[0], messages, options);
  if (!text.ok()) return 0;
  const bool qwen3 = parts[0].find("reasoning_content") != std::string::npos;
  for (const engine::ChatMessage& m : messages) {
    // Qwen3 strips <think> blocks from assistant turns; every other content appears verbatim.
    if (qwen3 && m.role == "assistant") continue;
    MOE_FUZZ_CHECK(text->find(m.content) != std::string::npos);
  }
  return 0;
}
