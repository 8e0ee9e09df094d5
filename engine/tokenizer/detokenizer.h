// IncrementalDetokenizer: streams generated ids as text without ever emitting half a character.
#pragma once

#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace moe::engine {

// Byte-level tokens may end inside a UTF-8 character (an emoji is often 2-4 tokens). Push()
// keeps such an incomplete tail until the bytes that complete it arrive. The concatenation of
// every Push() result and Flush() equals tokenizer.Decode(ids, skip_special).
//
// Not thread-safe; one per sequence. `tokenizer` must outlive it.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // Returns the text completed by `id` (often empty). Ids outside the vocabulary (a model's
  // embedding table can be larger than the tokenizer's) produce no text.
  std::string Push(int32_t id);

  // Returns what is still held, with an incomplete character replaced by U+FFFD, and resets.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet returned: at most an incomplete UTF-8 prefix
};

}  // namespace moe::engine
