// Tests of NFC and the Unicode primitives behind it (engine/tokenizer/normalize.h, unicode.h).
#include "engine/tokenizer/normalize.h"

#include <gtest/gtest.h>

#include "engine/tokenizer/unicode.h"

namespace moe::engine {
namespace {

std::u32string Nfc(const std::u32string& s) { return ToNfc(s); }

TEST(NormalizeTest, ComposesBaseAndCombiningMark) {
  EXPECT_EQ(Nfc(U"e\u0301"), U"\u00e9");
  EXPECT_EQ(Nfc(U"cafe\u0301 ok"), U"caf\u00e9 ok");
  EXPECT_EQ(Nfc(U"A\u030a"), U"\u00c5");
}

TEST(NormalizeTest, LeavesNfcTextAlone) {
  EXPECT_EQ(Nfc(U"plain ascii"), U"plain ascii");
  EXPECT_EQ(Nfc(U"\u00e9\u4e2d\u6587\U0001F600"), U"\u00e9\u4e2d\u6587\U0001F600");
  EXPECT_EQ(Nfc(U""), U"");
}

TEST(NormalizeTest, ReordersMarksByCombiningClass) {
  // a + circumflex (230) + dot below (220) -> a with dot below and circumflex (U+1EAD).
  EXPECT_EQ(Nfc(U"a\u0302\u0323"), U"\u1ead");
  EXPECT_EQ(Nfc(U"a\u0323\u0302"), U"\u1ead");
}

TEST(NormalizeTest, BlockedMarkDoesNotCompose) {
  // Overline (230) blocks the acute (230) from the base: nothing composes.
  EXPECT_EQ(Nfc(U"a\u0305\u0301"), U"a\u0305\u0301");
}

TEST(NormalizeTest, SingletonsAndExclusionsStayDecomposed) {
  EXPECT_EQ(Nfc(U"\u212b"), U"\u00c5");        // ANGSTROM SIGN -> A WITH RING
  EXPECT_EQ(Nfc(U"\u2126"), U"\u03a9");        // OHM SIGN -> OMEGA
  EXPECT_EQ(Nfc(U"\u0958"), U"\u0915\u093c");  // DEVANAGARI QA is a composition exclusion
}

TEST(NormalizeTest, HangulIsAlgorithmic) {
  EXPECT_EQ(Nfc(U"\u1100\u1161"), U"\uac00");        // L V -> LV
  EXPECT_EQ(Nfc(U"\u1100\u1161\u11a8"), U"\uac01");  // L V T -> LVT
  EXPECT_EQ(Nfc(U"\uac00\u11a8"), U"\uac01");        // LV T -> LVT
  EXPECT_EQ(Nfc(U"\ud55c\uad6d\uc5b4"), U"\ud55c\uad6d\uc5b4");
}

TEST(UnicodeTest, CharacterClasses) {
  EXPECT_TRUE(IsLetter(U'\u00e9'));
  EXPECT_TRUE(IsLetter(U'\u4e2d'));  // CJK, from a First/Last range in UnicodeData.txt
  EXPECT_TRUE(IsLetter(U'\uac00'));  // Hangul syllable, also a range
  EXPECT_FALSE(IsLetter(U'1'));
  EXPECT_TRUE(IsNumber(U'\u0663'));  // ARABIC-INDIC DIGIT THREE
  EXPECT_TRUE(IsNumber(U'\u00bd'));  // VULGAR FRACTION ONE HALF (No)
  EXPECT_TRUE(IsWhiteSpace(U'\u3000'));
  EXPECT_TRUE(IsWhiteSpace(U'\u00a0'));
  EXPECT_FALSE(IsWhiteSpace(U'\u200b'));  // ZERO WIDTH SPACE is not White_Space
  EXPECT_FALSE(IsLetter(U'\U0001F600'));
  EXPECT_EQ(CombiningClass(U'\u0301'), 230);
  EXPECT_EQ(CombiningClass(U'a'), 0);
}

TEST(UnicodeTest, Utf8DecodeRejectsMalformedInput) {
  EXPECT_TRUE(DecodeUtf8("h\xc3\xa9").ok());
  for (const char* bad :
       {"\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xff", "a\x80"}) {
    absl::StatusOr<std::u32string> r = DecodeUtf8(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(UnicodeTest, LossyReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
  EXPECT_EQ(Utf8Lossy("a\xe2\x82"
                      "b"),
            "a\xef\xbf\xbd"
            "b");  // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(Utf8Lossy("\xff\xfe"), "\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(Utf8Lossy("\xf0\x9f\x98"), "\xef\xbf\xbd");
}

}  // namespace
}  // namespace moe::engine
