// StopStringFilter: keep back the longest suffix that is a proper prefix of some stop string.
#include "engine/stop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace moe::engine {

absl::Status StopConditions::Validate(int64_t vocab_size) const {
  if (max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens = ", max_tokens, ": must be > 0"));
  }
  for (const std::string& s : stop_strings) {
    if (s.empty()) return absl::InvalidArgumentError("stop: an empty stop string never matches");
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids: ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

std::string StopStringFilter::Push(absl::string_view text, bool* stopped) {
  *stopped = false;
  pending_.append(text.data(), text.size());
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::Flush() { return std::exchange(pending_, std::string()); }

}  // namespace moe::engine
