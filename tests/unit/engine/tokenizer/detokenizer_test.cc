// Tests of IncrementalDetokenizer (engine/tokenizer/detokenizer.h) over multi-byte characters.
#include "engine/tokenizer/detokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "tests/unit/engine/tokenizer/tiny_tokenizer.h"

namespace moe::engine {
namespace {

using ::moe::engine::testing::TinyTokenizerJson;
using ::testing::ElementsAre;

// Bytes only (ids 0..255 are the bytes), plus "\xe4\xb8" (256) so a CJK character splits as
// 2 + 1 bytes, and one special token (257).
std::unique_ptr<Tokenizer> ByteTokenizer() {
  return *Tokenizer::FromJson(TinyTokenizerJson({{"\xe4", "\xb8"}}, {{"<|im_end|>", true}}).dump());
}

std::vector<std::string> PushAll(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(detok.Push(id));
  return out;
}

TEST(IncrementalDetokenizerTest, EmojiSplitAcrossFourTokens) {
  auto tok = ByteTokenizer();
  IncrementalDetokenizer detok(*tok);
  // U+1F600 is F0 9F 98 80.
  EXPECT_THAT(PushAll(detok, {'a', 0xF0, 0x9F, 0x98, 0x80, 'b'}),
              ElementsAre("a", "", "", "", "\U0001F600", "b"));
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizerTest, CjkSplitAcrossTokens) {
  auto tok = ByteTokenizer();
  ASSERT_EQ(*tok->Encode("\u4e2d\u6587"), (std::vector<int32_t>{256, 0xAD, 0xE6, 0x96, 0x87}));
  IncrementalDetokenizer detok(*tok);
  EXPECT_THAT(PushAll(detok, *tok->Encode("\u4e2d\u6587")),
              ElementsAre("", "\u4e2d", "", "", "\u6587"));
}

TEST(IncrementalDetokenizerTest, FlushReplacesAnIncompleteTail) {
  auto tok = ByteTokenizer();
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.Push(0xE6), "");
  EXPECT_EQ(detok.Push(0x96), "");
  EXPECT_EQ(detok.Flush(), "\xef\xbf\xbd");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(IncrementalDetokenizerTest, InvalidBytesAreNotHeldBack) {
  auto tok = ByteTokenizer();
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.Push(0xFF), "\xef\xbf\xbd");
  EXPECT_EQ(detok.Push(0xE6), "");
  EXPECT_EQ(detok.Push('x'), "\xef\xbf\xbdx");  // E6 cannot be completed by 'x'
}

TEST(IncrementalDetokenizerTest, SpecialsAndUnknownIds) {
  auto tok = ByteTokenizer();
  IncrementalDetokenizer keep(*tok);
  EXPECT_EQ(keep.Push(257), "<|im_end|>");
  EXPECT_EQ(keep.Push(151936), "");  // beyond the vocab: no text, no crash
  IncrementalDetokenizer skip(*tok, /*skip_special=*/true);
  EXPECT_EQ(skip.Push(257), "");
}

TEST(IncrementalDetokenizerTest, ConcatenationEqualsDecode) {
  auto tok = ByteTokenizer();
  std::mt19937 rng(7);
  // Mostly valid multi-byte text with random cuts and occasional junk bytes.
  const std::string pieces[] = {"a", "\u00e9", "\u4e2d", "\U0001F600", "\xff", "\xe4", " "};
  for (int round = 0; round < 200; ++round) {
    std::string text;
    for (int k = 0; k < 12; ++k) text += pieces[rng() % 7];
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    IncrementalDetokenizer detok(*tok);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.Push(id);
    streamed += detok.Flush();
    EXPECT_EQ(streamed, *tok->Decode(ids)) << round;
  }
}

}  // namespace
}  // namespace moe::engine
