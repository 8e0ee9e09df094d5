// The trained default model as the product serves it: the files moe-worker writes
// (WriteTrainedModel) are the committed ones, and the engine's greedy answers to the three fixed
// chat prompts are transformers' (tests/golden/fixtures/trained_default/expected.json, made by
// train.py), readable text: valid UTF-8, no replacement character, no special token.
#include "engine/trained_model.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/engine.h"
#include "engine/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace moe::engine {
namespace {

const std::string kCommitted = std::string(MOE_SOURCE_DIR) + "/engine/default_model";

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TrainedModel, WritesTheCommittedFiles) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteTrainedModel(dir.path()).ok());
  for (const char* name : {"config.json", "generation_config.json", "model.safetensors",
                           "tokenizer.json", "tokenizer_config.json"}) {
    const std::string written = Read(dir.path() + "/" + name);
    EXPECT_FALSE(written.empty()) << name;
    EXPECT_EQ(written, Read(kCommitted + "/" + name)) << name;
  }
}

TEST(TrainedModel, GreedyAnswersAreTransformersAndReadable) {
  auto backend = kernels::MakeBackend(kernels::BackendKind::kCpu, {});
  ASSERT_TRUE(backend.ok());
  auto model = Model::Load(kCommitted, **backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto tokenizer = Tokenizer::LoadFromDir(kCommitted);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::ifstream in(std::string(MOE_SOURCE_DIR) +
                   "/tests/golden/fixtures/trained_default/expected.json");
  const auto expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected["answers"].size(), 3u);

  for (const auto& answer : expected["answers"]) {
    const std::string user = answer["prompt"];
    auto engine = Engine::Create(**model, **tokenizer, EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Request r;
    r.id = "r";
    // The chat template's rendering of one user turn (ChatML), as train.py gave transformers.
    auto prompt =
        (*tokenizer)->Encode("<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n");
    ASSERT_TRUE(prompt.ok());
    r.prompt = *prompt;
    r.sampling.temperature = 0.f;
    r.stop.max_tokens = 48;
    ASSERT_TRUE((*engine)->Add(std::move(r)).ok());
    std::vector<int32_t> ids;
    std::string text;
    while ((*engine)->HasWork()) {
      for (Event& e : (*engine)->Step()) {
        if (e.token) ids.push_back(*e.token);
        text += e.text;
      }
    }
    // transformers' ids end on <|im_end|>, which the engine also generates (and stops on).
    EXPECT_EQ(ids, answer["ids"].get<std::vector<int32_t>>()) << user;
    EXPECT_EQ(text, answer["text"].get<std::string>()) << user;
    EXPECT_TRUE(DecodeUtf8(text).ok()) << user;
    EXPECT_EQ(text.find("\xEF\xBF\xBD"), std::string::npos) << user;  // U+FFFD
    EXPECT_EQ(text.find("<|"), std::string::npos) << user;
    EXPECT_GT(text.size(), 20u) << user;
    std::printf("%s -> %s\n", user.c_str(), text.c_str());
  }
}

}  // namespace
}  // namespace moe::engine
