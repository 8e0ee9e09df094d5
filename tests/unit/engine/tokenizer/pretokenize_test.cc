// Tests of the hand-written split matchers and the byte-level map (engine/tokenizer/pretokenize.h).
#include "engine/tokenizer/pretokenize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer/unicode.h"

namespace moe::engine {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Qwen(const std::string& utf8) {
  return PreTokenize(*DecodeUtf8(utf8), SplitPattern::kQwen2);
}
std::vector<std::string> Gpt2(const std::string& utf8) {
  return PreTokenize(*DecodeUtf8(utf8), SplitPattern::kGpt2);
}

TEST(PreTokenizeQwen2Test, WordsKeepTheirLeadingSpace) {
  EXPECT_THAT(Qwen("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Qwen("(hello)"), ElementsAre("(hello", ")"));
  EXPECT_THAT(Qwen("\tindented"), ElementsAre("\tindented"));
}

TEST(PreTokenizeQwen2Test, ContractionsIgnoreCase) {
  EXPECT_THAT(Qwen("I'm"), ElementsAre("I", "'m"));
  EXPECT_THAT(Qwen("WE'LL"), ElementsAre("WE", "'LL"));
  EXPECT_THAT(Qwen("it's"), ElementsAre("it", "'s"));
}

TEST(PreTokenizeQwen2Test, DigitsAreSingle) {
  EXPECT_THAT(Qwen("abc123"), ElementsAre("abc", "1", "2", "3"));
  EXPECT_THAT(Qwen(" 42"), ElementsAre(" ", "4", "2"));
}

TEST(PreTokenizeQwen2Test, PunctuationTakesFollowingNewlines) {
  EXPECT_THAT(Qwen("hello!!!\n"), ElementsAre("hello", "!!!\n"));
  EXPECT_THAT(Qwen("a = b;\r\n"), ElementsAre("a", " =", " b", ";\r\n"));
}

TEST(PreTokenizeQwen2Test, Whitespace) {
  EXPECT_THAT(Qwen("a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Qwen("a\n\nb"), ElementsAre("a", "\n\n", "b"));
  EXPECT_THAT(Qwen("x  \n  y"), ElementsAre("x", "  \n", " ", " y"));
  EXPECT_THAT(Qwen("  trailing  "), ElementsAre(" ", " trailing", "  "));
  EXPECT_THAT(Qwen(" "), ElementsAre(" "));
}

TEST(PreTokenizeQwen2Test, NonAscii) {
  EXPECT_THAT(Qwen("中文 text"), ElementsAre("中文", " text"));
  EXPECT_THAT(Qwen("hi 😀!"), ElementsAre("hi", " 😀!"));
  EXPECT_THAT(Qwen("\u3000word"), ElementsAre("\u3000word"));
}

TEST(PreTokenizeGpt2Test, Pattern) {
  EXPECT_THAT(Gpt2("Hello world's 123"), ElementsAre("Hello", " world", "'s", " 123"));
  EXPECT_THAT(Gpt2("I'M"), ElementsAre("I", "'", "M"));  // case-sensitive
  EXPECT_THAT(Gpt2("a  b\n"), ElementsAre("a", " ", " b", "\n"));
  EXPECT_THAT(Gpt2("x!!"), ElementsAre("x", "!!"));
}

TEST(ByteLevelTest, MapIsABijection) {
  EXPECT_EQ(ByteToChar(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(ByteToChar('\n'), U'\u010a');  // 'Ċ'
  EXPECT_EQ(ByteToChar('a'), U'a');
  for (int b = 0; b < 256; ++b) {
    std::optional<uint8_t> back = CharToByte(ByteToChar(static_cast<uint8_t>(b)));
    ASSERT_TRUE(back.has_value()) << b;
    EXPECT_EQ(*back, b);
  }
  EXPECT_FALSE(CharToByte(U'\u4e2d').has_value());
}

}  // namespace
}  // namespace moe::engine
