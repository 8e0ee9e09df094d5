// NFC per UAX #15: full canonical decomposition, canonical ordering, then recomposition.
#include "engine/tokenizer/normalize.h"

#include <algorithm>

#include "engine/tokenizer/unicode.h"

namespace moe::engine {
namespace {

// Hangul constants (Unicode chapter 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr char32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void Decompose(char32_t cp, std::u32string* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  std::optional<CanonicalPair> d = CanonicalDecomposition(cp);
  if (!d) {
    out->push_back(cp);
    return;
  }
  Decompose(d->first, out);  // recursion depth is bounded by the data (at most a few levels)
  if (d->second != 0) Decompose(d->second, out);
}

std::optional<char32_t> Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  return CanonicalComposition(a, b);
}

// Stable sort of each run of non-starters by combining class.
void CanonicalOrder(std::u32string* s) {
  size_t i = 0;
  while (i < s->size()) {
    if (CombiningClass((*s)[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s->size() && CombiningClass((*s)[j]) != 0) ++j;
    std::stable_sort(s->begin() + i, s->begin() + j,
                     [](char32_t a, char32_t b) { return CombiningClass(a) < CombiningClass(b); });
    i = j;
  }
}

// Canonical composition algorithm: each character combines with the last starter unless a
// character in between blocks it (same or higher class, or a starter).
void Recompose(std::u32string* s) {
  if (s->empty()) return;
  size_t starter = 0, out = 1;
  bool have_starter = CombiningClass((*s)[0]) == 0;
  int last_class = have_starter ? 0 : 256;
  for (size_t i = 1; i < s->size(); ++i) {
    char32_t c = (*s)[i];
    int cc = CombiningClass(c);
    // last_class == 0 means `c` is adjacent to the starter (two starters compose only then).
    bool blocked = last_class != 0 && last_class >= cc;
    if (have_starter && !blocked) {
      if (std::optional<char32_t> comp = Compose((*s)[starter], c)) {
        (*s)[starter] = *comp;
        continue;
      }
    }
    if (cc == 0) {
      starter = out;
      have_starter = true;
    }
    last_class = cc;
    (*s)[out++] = c;
  }
  s->resize(out);
}

bool NeedsWork(const std::u32string& text) {
  // Below U+0300 nothing decomposes except Latin-1 letters that are already composed, and nothing
  // combines, so such text is already NFC.
  return std::any_of(text.begin(), text.end(), [](char32_t c) { return c >= 0x300; });
}

}  // namespace

std::u32string ToNfc(const std::u32string& text) {
  if (!NeedsWork(text)) return text;
  std::u32string d;
  d.reserve(text.size() + 8);
  for (char32_t cp : text) Decompose(cp, &d);
  CanonicalOrder(&d);
  Recompose(&d);
  return d;
}

}  // namespace moe::engine
