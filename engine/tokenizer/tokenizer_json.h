// Parsing of Hugging Face tokenizer.json into the plain description the Tokenizer is built from.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/pretokenize.h"

namespace moe::engine {

struct AddedToken {
  int32_t id = 0;
  std::string content;   // raw text matched in the input before normalization
  bool special = false;  // skipped by Decode(skip_special); matched only with allow_special
};

struct TokenizerSpec {
  bool nfc = false;  // normalizer: NFC, or a Sequence of NFC; false for null/absent
  SplitPattern split = SplitPattern::kQwen2;
  std::vector<std::pair<std::string, int32_t>> vocab;  // byte-level strings as in the file
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;
  std::vector<AddedToken> added_tokens;
};

// Accepted (anything else is Unimplemented, naming the field and value):
//   normalizer: null/absent, {"type":"NFC"}, or a Sequence whose members are all NFC;
//   pre_tokenizer: Sequence[Split(Qwen2 regex, Isolated, invert false), ByteLevel(use_regex
//     false)], or ByteLevel(use_regex true) alone (GPT-2); add_prefix_space must be false;
//   model: BPE with vocab and merges ("a b" strings or ["a","b"] pairs), no dropout, no
//     continuing_subword_prefix/end_of_word_suffix;
//   decoder: ByteLevel or null/absent. post_processor is ignored (no BOS/EOS are added).
// Returns InvalidArgument for malformed JSON or missing/mistyped required fields.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(const std::string& tokenizer_json);

}  // namespace moe::engine
