// Unicode Normalization Form C (canonical decomposition, reordering, canonical composition).
#pragma once

#include <string>

namespace moe::engine {

// NFC of `text` as code points (Unicode 15 data from the build machine's unicode-data package).
// Hangul syllables are composed and decomposed algorithmically.
std::u32string ToNfc(const std::u32string& text);

}  // namespace moe::engine
