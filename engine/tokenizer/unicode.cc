// UTF-8 coding and binary searches over the generated Unicode tables.
#include "engine/tokenizer/unicode.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/unicode_tables.h"

namespace moe::engine {
namespace {
namespace ud = unicode_data;

uint8_t RangeValue(const ud::Range* ranges, size_t size, char32_t cp) {
  const ud::Range* end = ranges + size;
  const ud::Range* it =
      std::upper_bound(ranges, end, cp, [](char32_t c, const ud::Range& r) { return c < r.first; });
  if (it == ranges) return 0;
  --it;
  return cp <= it->last ? it->value : 0;
}

uint8_t ClassBits(char32_t cp) {
  if (cp < 0x80) {  // ASCII fast path: most text is ASCII.
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return ud::kLetterBit;
    if (cp >= '0' && cp <= '9') return ud::kNumberBit;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return ud::kWhiteSpaceBit;
    return 0;
  }
  return RangeValue(ud::kClassRanges, ud::kClassRangesSize, cp);
}

}  // namespace

int Utf8SequenceLength(absl::string_view bytes) {
  if (bytes.empty()) return 0;
  auto b = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  uint8_t b0 = b(0);
  if (b0 < 0x80) return 1;
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= bytes.size()) return 0;
    uint8_t lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
    if (b(i) < lo_i || b(i) > hi_i) return -1;
  }
  return len;
}

absl::StatusOr<std::u32string> DecodeUtf8(absl::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    int len = Utf8SequenceLength(text.substr(i));
    if (len <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8 at byte offset ", i));
    }
    char32_t cp = static_cast<uint8_t>(text[i]);
    if (len > 1) {
      cp &= 0x7F >> len;
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string EncodeUtf8(const std::u32string& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, &out);
  return out;
}

std::string Utf8Lossy(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    int len = Utf8SequenceLength(bytes.substr(i));
    if (len > 0) {
      out.append(bytes.data() + i, len);
      i += len;
      continue;
    }
    // Maximal invalid subpart: the lead byte plus the continuation bytes that were still valid.
    size_t j = i + 1;
    while (j < bytes.size() && j - i < 4 && Utf8SequenceLength(bytes.substr(i, j - i + 1)) == 0) {
      ++j;
    }
    AppendUtf8(kReplacementChar, &out);
    i = j;
  }
  return out;
}

bool IsLetter(char32_t cp) { return ClassBits(cp) & ud::kLetterBit; }
bool IsNumber(char32_t cp) { return ClassBits(cp) & ud::kNumberBit; }
bool IsWhiteSpace(char32_t cp) { return ClassBits(cp) & ud::kWhiteSpaceBit; }

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  return RangeValue(ud::kCombiningClassRanges, ud::kCombiningClassRangesSize, cp);
}

std::optional<CanonicalPair> CanonicalDecomposition(char32_t cp) {
  const ud::Decomposition* end = ud::kDecompositions + ud::kDecompositionsSize;
  const ud::Decomposition* it =
      std::lower_bound(ud::kDecompositions, end, cp,
                       [](const ud::Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) return std::nullopt;
  return CanonicalPair{it->first, it->second};
}

std::optional<char32_t> CanonicalComposition(char32_t first, char32_t second) {
  const ud::Composition* end = ud::kCompositions + ud::kCompositionsSize;
  auto less = [](const ud::Composition& c, std::pair<char32_t, char32_t> key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  };
  const ud::Composition* it =
      std::lower_bound(ud::kCompositions, end, std::pair(first, second), less);
  if (it == end || it->first != first || it->second != second) return std::nullopt;
  return it->composite;
}

}  // namespace moe::engine
