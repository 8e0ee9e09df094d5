// ParseBytes / FormatBytes.
#include "kernels/base/bytes.h"

#include <cctype>
#include <cstdio>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace moe::base {

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < trimmed.size() && std::isdigit(static_cast<unsigned char>(trimmed[digits]))) {
    ++digits;
  }
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(trimmed.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("not a byte count: '", text, "'"));
  }
  const std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(trimmed.substr(digits)));
  struct Unit {
    const char* name;
    uint64_t scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},          {"b", 1},
      {"kb", 1000ull},  {"mb", 1000ull * 1000},  {"gb", 1000ull * 1000 * 1000},
      {"tb", 1000ull * 1000 * 1000 * 1000},
      {"kib", 1ull << 10}, {"mib", 1ull << 20}, {"gib", 1ull << 30}, {"tib", 1ull << 40},
  };
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      if (value > std::numeric_limits<uint64_t>::max() / u.scale) {
        return absl::InvalidArgumentError(absl::StrCat("byte count overflows: '", text, "'"));
      }
      return value * u.scale;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown unit in byte count '", text, "' (use B, KB, MB, GB, KiB, MiB, GiB)"));
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (v >= 1024.0 && i < 4) {
    v /= 1024.0;
    ++i;
  }
  char buf[32];
  if (i == 0) {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kNames[i]);
  }
  return buf;
}

}  // namespace moe::base
