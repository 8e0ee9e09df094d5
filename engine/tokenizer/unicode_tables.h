// Declarations of the Unicode tables that moe_unicode_gen writes into the build tree.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::engine::unicode_data {

// Code points [first, last] share `value`. Sorted, non-overlapping.
struct Range {
  uint32_t first;
  uint32_t last;
  uint8_t value;
};

// Canonical decomposition of `cp` into `first` (+ `second`, 0 for a singleton), one level deep.
struct Decomposition {
  uint32_t cp;
  uint32_t first;
  uint32_t second;
};

// Canonical composition of (first, second) into `composite`, exclusions removed.
struct Composition {
  uint32_t first;
  uint32_t second;
  uint32_t composite;
};

// Bits of kClassRanges values.
inline constexpr uint8_t kLetterBit = 1;      // General_Category L*
inline constexpr uint8_t kNumberBit = 2;      // General_Category N*
inline constexpr uint8_t kWhiteSpaceBit = 4;  // PropList White_Space

extern const Range kClassRanges[];
extern const size_t kClassRangesSize;
extern const Range kCombiningClassRanges[];  // nonzero Canonical_Combining_Class only
extern const size_t kCombiningClassRangesSize;
extern const Decomposition kDecompositions[];  // sorted by cp
extern const size_t kDecompositionsSize;
extern const Composition kCompositions[];  // sorted by (first, second)
extern const size_t kCompositionsSize;

}  // namespace moe::engine::unicode_data
