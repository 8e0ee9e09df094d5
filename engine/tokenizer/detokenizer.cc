// IncrementalDetokenizer: return every complete (or definitely invalid) byte sequence, hold a
// trailing prefix that may still become a character.
#include "engine/tokenizer/detokenizer.h"

#include "engine/tokenizer/unicode.h"

namespace moe::engine {

std::string IncrementalDetokenizer::Push(int32_t id) {
  std::optional<absl::string_view> bytes = tokenizer_.TokenBytes(id);
  if (!bytes || (skip_special_ && tokenizer_.IsSpecial(id))) return std::string();
  pending_.append(bytes->data(), bytes->size());
  // Find where an incomplete-but-valid tail starts; everything before it is final.
  size_t i = 0, ready = 0;
  while (i < pending_.size()) {
    int len = Utf8SequenceLength(absl::string_view(pending_).substr(i));
    if (len == 0) break;     // incomplete: wait for more bytes
    i += len > 0 ? len : 1;  // invalid bytes are final too (Utf8Lossy replaces them)
    ready = i;
  }
  std::string out = Utf8Lossy(absl::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace moe::engine
