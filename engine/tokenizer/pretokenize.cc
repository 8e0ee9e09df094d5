// Hand-written matchers equivalent to the two split regexes (leftmost alternative wins, as in a
// backtracking regex engine), so no regex library is needed.
#include "engine/tokenizer/pretokenize.h"

#include <array>

#include "engine/tokenizer/unicode.h"

namespace moe::engine {
namespace {

using Text = std::u32string;

bool IsCrLf(char32_t c) { return c == '\r' || c == '\n'; }
// [^\s\p{L}\p{N}]
bool IsOther(char32_t c) { return !IsWhiteSpace(c) && !IsLetter(c) && !IsNumber(c); }

char32_t Lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// Length of 's|'t|'re|'ve|'m|'ll|'d at i, or 0.
size_t MatchContraction(const Text& t, size_t i, bool ignore_case) {
  if (t[i] != '\'' || i + 1 >= t.size()) return 0;
  auto at = [&](size_t k) { return ignore_case ? Lower(t[k]) : t[k]; };
  char32_t a = at(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= t.size()) return 0;
  char32_t b = at(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

template <typename Pred>
size_t RunEnd(const Text& t, size_t i, Pred pred) {
  while (i < t.size() && pred(t[i])) ++i;
  return i;
}

// \s+(?!\S) then \s+ at a whitespace character: the run, minus its last character when a
// non-space follows and the run is longer than one (the lookahead forces the backtrack).
size_t MatchTrailingSpaceRun(const Text& t, size_t i) {
  size_t end = RunEnd(t, i, IsWhiteSpace);
  if (end < t.size() && end - i >= 2) return end - 1 - i;
  return end - i;
}

size_t MatchQwen2(const Text& t, size_t i) {
  if (size_t n = MatchContraction(t, i, /*ignore_case=*/true)) return n;
  char32_t c = t[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (IsLetter(c)) return RunEnd(t, i, IsLetter) - i;
  if (!IsCrLf(c) && !IsNumber(c) && i + 1 < t.size() && IsLetter(t[i + 1])) {
    return RunEnd(t, i + 1, IsLetter) - i;
  }
  // \p{N}
  if (IsNumber(c)) return 1;
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  size_t start = (c == ' ' && i + 1 < t.size() && IsOther(t[i + 1])) ? i + 1 : i;
  if (IsOther(t[start])) return RunEnd(t, RunEnd(t, start, IsOther), IsCrLf) - i;
  // Only whitespace is left. \s*[\r\n]+ : up to the last \r or \n of the whitespace run.
  size_t end = RunEnd(t, i, IsWhiteSpace);
  for (size_t k = end; k > i; --k) {
    if (IsCrLf(t[k - 1])) return k - i;
  }
  return MatchTrailingSpaceRun(t, i);
}

size_t MatchGpt2(const Text& t, size_t i) {
  if (size_t n = MatchContraction(t, i, /*ignore_case=*/false)) return n;
  size_t start = (t[i] == ' ' && i + 1 < t.size() && !IsWhiteSpace(t[i + 1])) ? i + 1 : i;
  char32_t c = t[start];
  if (IsLetter(c)) return RunEnd(t, start, IsLetter) - i;
  if (IsNumber(c)) return RunEnd(t, start, IsNumber) - i;
  if (IsOther(c)) return RunEnd(t, start, IsOther) - i;
  return MatchTrailingSpaceRun(t, i);
}

std::array<char32_t, 256> MakeByteToChar() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

const std::array<char32_t, 256>& ByteMap() {
  static const std::array<char32_t, 256> map = MakeByteToChar();
  return map;
}

}  // namespace

const char* SplitPatternRegex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kQwen2:
      return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
             "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    case SplitPattern::kGpt2:
      return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  }
  return "";
}

std::vector<std::string> PreTokenize(const std::u32string& text, SplitPattern pattern) {
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < text.size()) {
    size_t n = pattern == SplitPattern::kQwen2 ? MatchQwen2(text, i) : MatchGpt2(text, i);
    if (n == 0) n = 1;  // unreachable for these patterns; guarantees progress regardless
    std::string piece;
    for (size_t k = i; k < i + n; ++k) AppendUtf8(text[k], &piece);
    pieces.push_back(std::move(piece));
    i += n;
  }
  return pieces;
}

char32_t ByteToChar(uint8_t byte) { return ByteMap()[byte]; }

std::optional<uint8_t> CharToByte(char32_t cp) {
  if (cp < 256 && ByteMap()[cp] == cp) return static_cast<uint8_t>(cp);
  if (cp >= 256 && cp < 256 + 68) {  // 68 = number of non-printable bytes remapped upward
    for (int b = 0; b < 256; ++b) {
      if (ByteMap()[b] == cp) return static_cast<uint8_t>(b);
    }
  }
  return std::nullopt;
}

}  // namespace moe::engine
