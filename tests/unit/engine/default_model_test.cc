// The built-in models: the scripted model's greedy output is its script for any prompt that does
// not end on a piece of it, and it ends on <|im_end|>; a script that cannot fit is refused.
#include "engine/default_model.h"

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

// Greedy generation of `prompt` on the model in `dir`: the text and the finish reason.
std::pair<std::string, FinishReason> Greedy(const std::string& dir, const std::string& prompt) {
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  auto model = Model::Load(dir, **backend);
  EXPECT_TRUE(model.ok()) << model.status();
  auto tokenizer = Tokenizer::LoadFromDir(dir);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto engine = Engine::Create(**model, **tokenizer, EngineOptions{});
  EXPECT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.id = "r";
  r.prompt = *(*tokenizer)->Encode(prompt);
  r.sampling.temperature = 0.f;
  r.stop.max_tokens = 200;
  EXPECT_TRUE((*engine)->Add(std::move(r)).ok());
  std::string text;
  FinishReason finish = FinishReason::kNone;
  while ((*engine)->HasWork()) {
    for (Event& e : (*engine)->Step()) {
      text += e.text;
      if (e.finish != FinishReason::kNone) finish = e.finish;
    }
  }
  return {text, finish};
}

TEST(ScriptedModel, GreedyOutputIsTheScriptForAnyPrompt) {
  const std::string script =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>";
  testing::TempDir dir;
  ASSERT_TRUE(WriteScriptedModel(dir.path(), script).ok());
  for (const std::string& prompt : std::vector<std::string>{
           "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n",
           "Hello", script + " -- again?"}) {
    const auto [text, finish] = Greedy(dir.path(), prompt);
    EXPECT_EQ(text, script) << "prompt: " << prompt;
    EXPECT_EQ(finish, FinishReason::kStop) << "prompt: " << prompt;
  }
}

TEST(ScriptedModel, RepeatsAndMultiByteTextSurvive) {
  const std::string script = "ab ab ab ab ab — ü ü ü ü ü ü ü ü ab";
  testing::TempDir dir;
  ASSERT_TRUE(WriteScriptedModel(dir.path(), script).ok());
  EXPECT_EQ(Greedy(dir.path(), "x").first, script);
}

TEST(ScriptedModel, RefusesEmptyAndOverlongScripts) {
  testing::TempDir dir;
  EXPECT_EQ(WriteScriptedModel(dir.path(), "").code(), absl::StatusCode::kInvalidArgument);
  std::string long_script;
  for (int i = 0; i < 2000; ++i) long_script += std::to_string(i) + " ";  // ~2,000 pieces
  EXPECT_EQ(WriteScriptedModel(dir.path(), long_script).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moe::engine
