// Fuzz target: engine::ChatTemplate (the Jinja engine). Input, split at NUL bytes: the chat
// template source, then (role, content) pairs; the last byte's bits pick add_generation_prompt
// and enable_thinking. Any template must parse or fail with a status, and render or fail with a
// status, never crash. The built-in ChatML template must keep every content verbatim.
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
  engine::TemplateJson messages = engine::TemplateJson::array();
  for (size_t i = 1; i + 1 < parts.size(); i += 2) {
    // Template data is UTF-8 (the request's proto3 strings are); skip what JSON cannot hold.
    try {
      engine::TemplateJson(parts[i + 1]).dump();
      engine::TemplateJson(parts[i]).dump();
    } catch (const engine::TemplateJson::exception&) {
      return 0;
    }
    messages.push_back({{"role", parts[i]}, {"content", parts[i + 1]}});
  }
  const uint8_t flags = size > 0 ? data[size - 1] : 0;
  const engine::TemplateJson extra = {{"enable_thinking", (flags & 2) != 0}};
  for (const std::string& source : {parts[0], std::string(engine::ChatMlTemplate())}) {
    auto chat = engine::ChatTemplate::Compile(source, "<s>", "</s>");
    if (!chat.ok()) continue;
    auto text = chat->Render(messages, nullptr, extra, flags & 1);
    if (!text.ok() || source != engine::ChatMlTemplate()) continue;
    for (const auto& m : messages) {
      MOE_FUZZ_CHECK(text->find(m["content"].get<std::string>()) != std::string::npos);
    }
  }
  return 0;
}
