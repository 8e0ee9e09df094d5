// Stop conditions and the text filter that withholds output which may be the start of a stop
// string, so a stop string never reaches the client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace moe::engine {

struct StopConditions {
  int64_t max_tokens = 256;              // > 0
  std::vector<std::string> stop_strings;  // the generated text ends before the first match
  std::vector<int32_t> stop_token_ids;    // in addition to the model's EOS ids
  bool ignore_eos = false;
  // InvalidArgument naming the field.
  absl::Status Validate(int64_t vocab_size) const;
};

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stop_strings)
      : stops_(std::move(stop_strings)) {}
  // Appends newly decoded text; returns what is now safe to emit. Sets *stopped when a stop
  // string completed: the text before it has been returned, the rest is dropped.
  std::string Push(absl::string_view text, bool* stopped);
  // The withheld tail, at the end of a generation that did not stop on a string.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

}  // namespace moe::engine
