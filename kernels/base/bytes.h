// Byte counts as users write them ("24GiB", "512MB", "0") and as we print them.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace moe::base {

// Parses an integer with an optional unit: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB
// (powers of 1024). InvalidArgument names the text when it is not a byte count or overflows.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

// "1.50 GiB", "512 B": binary units, two decimals.
std::string FormatBytes(uint64_t bytes);

}  // namespace moe::base
