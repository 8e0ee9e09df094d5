// Pre-tokenization: the Qwen2 and GPT-2 split regexes as hand-written matchers, and the GPT-2
// byte <-> character map of the ByteLevel pre-tokenizer and decoder.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace moe::engine {

enum class SplitPattern {
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  // \s*[\r\n]+|\s+(?!\S)|\s+                      (Qwen2/Qwen3 tokenizer.json, Split "Isolated")
  kQwen2,
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  //                                             (ByteLevel with use_regex: true, GPT-2)
  kGpt2,
};

// The regex source text of `pattern`, exactly as tokenizer.json spells it.
const char* SplitPatternRegex(SplitPattern pattern);

// Splits `text` into consecutive matches of `pattern` (every character belongs to exactly one
// piece; the patterns match any character, so there are no unmatched gaps). Returns UTF-8 pieces.
// \s is White_Space, \p{L} and \p{N} are the general categories L* and N*.
std::vector<std::string> PreTokenize(const std::u32string& text, SplitPattern pattern);

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the others to U+0100 and up.
char32_t ByteToChar(uint8_t byte);
// Inverse of ByteToChar; nullopt for characters outside the 256-character alphabet.
std::optional<uint8_t> CharToByte(char32_t cp);

}  // namespace moe::engine
