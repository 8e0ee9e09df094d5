// Tests of Tokenizer (engine/tokenizer/tokenizer.h): BPE merge order, added tokens, decode, and
// malformed tokenizer.json documents that must give an error, never a crash.
#include "engine/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/engine/tokenizer/tiny_tokenizer.h"

namespace moe::engine {
namespace {

using ::moe::engine::testing::TinyTokenizerJson;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<Tokenizer> Make(const nlohmann::json& j) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& tok, const std::string& text, bool allow_special = true) {
  absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(text, allow_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// Merges: 256 "he", 257 "ll", 258 "hell", 259 "hello", 260 " w" (Ġw).
std::unique_ptr<Tokenizer> Hello(bool pair_form = true) {
  return Make(TinyTokenizerJson({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}},
                                {{"<|im_start|>", true}, {"<|im_end|>", true}, {"<think>", false}},
                                pair_form));
}

TEST(TokenizerTest, MergesByRank) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Ids(*tok, "hello"), ElementsAre(259));
  EXPECT_THAT(Ids(*tok, "hello world"), ElementsAre(259, 260, 'o', 'r', 'l', 'd'));
  EXPECT_THAT(Ids(*tok, "help"), ElementsAre(256, 'l', 'p'));
  EXPECT_THAT(Ids(*tok, ""), ElementsAre());
}

TEST(TokenizerTest, StringAndPairMergesAgree) {
  auto pairs = Hello(true), strings = Hello(false);
  ASSERT_NE(pairs, nullptr);
  ASSERT_NE(strings, nullptr);
  for (const char* text : {"hello", "hello world", "shell hello"}) {
    EXPECT_EQ(Ids(*pairs, text), Ids(*strings, text)) << text;
  }
}

TEST(TokenizerTest, EqualRankPairsMergeLeftToRight) {
  auto tok = Make(TinyTokenizerJson({{"a", "a"}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Ids(*tok, "aaa"), ElementsAre(256, 'a'));
  EXPECT_THAT(Ids(*tok, "aaaa"), ElementsAre(256, 256));
}

TEST(TokenizerTest, LowerRankWinsOverPosition) {
  // "bc" (rank 0) beats "ab" (rank 1) even though "ab" is further left.
  auto tok = Make(TinyTokenizerJson({{"b", "c"}, {"a", "b"}}));
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Ids(*tok, "abc"), ElementsAre('a', 256));
}

TEST(TokenizerTest, AddedTokensSplitTheRawText) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Ids(*tok, "<|im_start|>hello<|im_end|>"), ElementsAre(261, 259, 262));
  // Special tokens become plain text when not allowed; non-special added tokens still match.
  std::vector<int32_t> plain = Ids(*tok, "<|im_end|>", /*allow_special=*/false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_THAT(Ids(*tok, "<think>", /*allow_special=*/false), ElementsAre(263));
  EXPECT_THAT(Ids(*tok, "a<think>b"), ElementsAre('a', 263, 'b'));
}

TEST(TokenizerTest, DecodeAndSpecials) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = Ids(*tok, "<|im_start|>hello world<|im_end|>");
  EXPECT_EQ(*tok->Decode(ids), "<|im_start|>hello world<|im_end|>");
  EXPECT_EQ(*tok->Decode(ids, /*skip_special=*/true), "hello world");
  EXPECT_TRUE(tok->IsSpecial(261));
  EXPECT_FALSE(tok->IsSpecial(263));  // <think> is added but not special
  EXPECT_FALSE(tok->IsSpecial(259));
  EXPECT_FALSE(tok->IsSpecial(-1));
  EXPECT_EQ(tok->TokenId("<|im_end|>"), 262);
  EXPECT_EQ(tok->TokenId("\u0120w"), 260);  // byte-level spelling of " w"
  EXPECT_EQ(tok->TokenId("nope"), std::nullopt);
  EXPECT_EQ(tok->vocab_size(), 264);
}

TEST(TokenizerTest, NormalizesToNfcBeforeSplitting) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(Ids(*tok, "cafe\u0301"), Ids(*tok, "caf\u00e9"));
  EXPECT_EQ(*tok->Decode(Ids(*tok, "cafe\u0301")), "caf\u00e9");
}

TEST(TokenizerTest, DecodeOfPartialCharacterIsReplaced) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Decode({0xE4, 0xB8}), "\xef\xbf\xbd");  // first two bytes of U+4E2D
  EXPECT_EQ(*tok->Decode({0xE4, 0xB8, 0xAD}), "\u4e2d");
}

TEST(TokenizerTest, UnknownIdOnDecodeIsInvalidArgument) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  for (int32_t bad : {264, 999999, -3}) {
    absl::StatusOr<std::string> text = tok->Decode({104, bad});
    ASSERT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(), HasSubstr(absl::StrCat("token id ", bad)));
  }
}

TEST(TokenizerTest, InvalidUtf8OnEncodeIsInvalidArgument) {
  auto tok = Hello();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("ab\xff").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tok->Encode("<|im_end|>\xc3").status().code(), absl::StatusCode::kInvalidArgument);
}

absl::StatusCode LoadCode(const std::string& text) {
  return Tokenizer::FromJson(text).status().code();
}

TEST(TokenizerMalformedTest, BadDocumentsGiveErrors) {
  EXPECT_EQ(LoadCode("{not json"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadCode("[1, 2]"), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadCode(""), absl::StatusCode::kInvalidArgument);
  nlohmann::json good = TinyTokenizerJson({{"h", "e"}});

  nlohmann::json j = good;
  j.erase("model");
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"].erase("vocab");
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["vocab"] = "oops";
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["vocab"]["x"] = "not a number";
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["vocab"]["x"] = -5;
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["merges"].push_back({"h", "zzz"});
  absl::Status st = Tokenizer::FromJson(j.dump()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("zzz"));
  j = good;
  j["model"]["merges"].push_back("h");  // no space
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["merges"].push_back({"x", "y"});  // both exist, "xy" does not
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["vocab"].erase("a");  // byte-level BPE needs every byte
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["model"]["vocab"]["dup"] = 5;  // id 5 already belongs to byte 0x05
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
  j = good;
  j["added_tokens"] = {{{"content", "<x>"}}};  // no id
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerMalformedTest, UnsupportedPartsAreUnimplemented) {
  nlohmann::json good = TinyTokenizerJson({});
  nlohmann::json j = good;
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kUnimplemented);
  j = good;
  j["model"]["type"] = "WordPiece";
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kUnimplemented);
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  EXPECT_EQ(LoadCode(j.dump()), absl::StatusCode::kUnimplemented);
}

TEST(TokenizerTest, AcceptedNormalizerForms) {
  nlohmann::json j = TinyTokenizerJson({});
  j["normalizer"] = nullptr;
  auto none = Make(j);
  ASSERT_NE(none, nullptr);
  EXPECT_NE(Ids(*none, "e\u0301"), Ids(*none, "\u00e9"));  // no NFC
  j.erase("normalizer");
  EXPECT_NE(Make(j), nullptr);
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}}}};
  auto seq = Make(j);
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(Ids(*seq, "e\u0301"), Ids(*seq, "\u00e9"));
}

TEST(TokenizerTest, Gpt2ByteLevelPreTokenizer) {
  nlohmann::json j = TinyTokenizerJson({{" ", "w"}});
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto tok = Make(j);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(Ids(*tok, "a w"), ElementsAre('a', 256));
}

}  // namespace
}  // namespace moe::engine
