// Robustness of Tokenizer::FromJson: thousands of mutated tokenizer.json documents must each give
// a Status (OK or an error), never a crash or an uncaught exception.
#include <gtest/gtest.h>

#include <random>

#include "engine/tokenizer/tokenizer.h"
#include "tests/unit/engine/tokenizer/tiny_tokenizer.h"

namespace moe::engine {
namespace {

using ::moe::engine::testing::TinyTokenizerJson;
using nlohmann::json;

json RandomValue(std::mt19937& rng) {
  switch (rng() % 7) {
    case 0:
      return nullptr;
    case 1:
      return static_cast<int>(rng() % 5) - 2;
    case 2:
      return 1e300;
    case 3:
      return "Ġ";
    case 4:
      return json::array({"a", "b"});
    case 5:
      return json::object({{"type", "NFC"}});
    default:
      return true;
  }
}

// Replaces one node, chosen by walking a random path from the root, with a random value, or
// removes it from its parent.
void Mutate(json* node, std::mt19937& rng) {
  while (true) {
    bool container = (node->is_object() || node->is_array()) && !node->empty();
    if (!container || rng() % 4 == 0) {
      *node = RandomValue(rng);
      return;
    }
    size_t k = rng() % node->size();
    if (node->is_array()) {
      if (rng() % 8 == 0) {
        node->erase(k);
        return;
      }
      node = &(*node)[k];
    } else {
      auto it = node->begin();
      std::advance(it, k);
      if (rng() % 8 == 0) {
        node->erase(it);
        return;
      }
      node = &it.value();
    }
  }
}

void Exercise(const std::string& text) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(text);
  if (!tok.ok()) return;
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("Hello <|im_start|> wörld 😀\n\n");
  if (ids.ok()) {
    EXPECT_TRUE((*tok)->Decode(*ids).ok());
  }
}

TEST(TokenizerFuzzTest, StructuralMutationsNeverCrash) {
  const json base =
      TinyTokenizerJson({{"h", "e"}, {"l", "l"}, {"he", "ll"}}, {{"<|im_start|>", true}});
  std::mt19937 rng(1234);
  for (int i = 0; i < 3000; ++i) {
    json doc = base;
    for (int m = 0, n = 1 + rng() % 3; m < n; ++m) Mutate(&doc, rng);
    Exercise(doc.dump());
  }
}

TEST(TokenizerFuzzTest, ByteMutationsNeverCrash) {
  const std::string base = TinyTokenizerJson({{"h", "e"}}, {{"<x>", false}}).dump();
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    std::string text = base;
    for (int m = 0; m < 4; ++m) text[rng() % text.size()] = static_cast<char>(rng() % 256);
    Exercise(text);
    Exercise(text.substr(0, rng() % text.size()));  // truncated documents
  }
}

// Found by fuzz_tokenizer_json (tests/fuzz/corpus/fuzz_tokenizer_json/crash-*): a float id went
// through nlohmann's float->int conversion, undefined when out of range. Ids must be integers.
TEST(TokenizerFuzzTest, NonIntegerIdsAreInvalidArgument) {
  for (const json& bad : {json(2.9e115), json(3.5), json("7")}) {
    json j = TinyTokenizerJson({{"h", "e"}}, {{"<x>", false}});
    j["model"]["vocab"]["he"] = bad;
    auto st = Tokenizer::FromJson(j.dump()).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("vocab id"), std::string::npos) << st;
    j = TinyTokenizerJson({{"h", "e"}}, {{"<x>", false}});
    j["added_tokens"][0]["id"] = bad;
    st = Tokenizer::FromJson(j.dump()).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("added token id"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace moe::engine
