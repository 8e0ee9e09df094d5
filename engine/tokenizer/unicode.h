// Unicode primitives for the tokenizer: UTF-8 coding, character classes, NFC data lookups.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::engine {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes UTF-8. Returns InvalidArgument naming the byte offset on malformed input (overlong
// forms, surrogates and values above U+10FFFF are malformed too).
absl::StatusOr<std::u32string> DecodeUtf8(absl::string_view text);

// Appends the UTF-8 form of `cp` (which must be a valid scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);
std::string EncodeUtf8(const std::u32string& cps);

// Length of the complete, valid UTF-8 sequence at the start of `bytes`: 1-4; 0 when `bytes` is a
// proper prefix of a valid sequence (more bytes may complete it); -1 when it is invalid.
int Utf8SequenceLength(absl::string_view bytes);

// Replaces each maximal invalid subsequence with U+FFFD, like Rust's String::from_utf8_lossy
// (what Hugging Face tokenizers does when decoding bytes that are not UTF-8).
std::string Utf8Lossy(absl::string_view bytes);

bool IsLetter(char32_t cp);      // General_Category L*  (regex \p{L})
bool IsNumber(char32_t cp);      // General_Category N*  (regex \p{N})
bool IsWhiteSpace(char32_t cp);  // White_Space property (regex \s)

// Canonical_Combining_Class; 0 for starters.
uint8_t CombiningClass(char32_t cp);

// One level of canonical decomposition: {first, second} with second == 0 for a singleton;
// nullopt when `cp` has none. Hangul syllables are not in the table (they are algorithmic).
struct CanonicalPair {
  char32_t first;
  char32_t second;
};
std::optional<CanonicalPair> CanonicalDecomposition(char32_t cp);

// Primary composite of (first, second), Hangul excluded; nullopt when none.
std::optional<char32_t> CanonicalComposition(char32_t first, char32_t second);

}  // namespace moe::engine
