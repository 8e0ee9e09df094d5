// BPE merging with a min-heap of candidate pairs ordered by (merge rank, position), the order
// Hugging Face tokenizers uses, so equal-rank pairs merge left to right.
#include "engine/tokenizer/bpe.h"

#include <queue>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace moe::engine {
namespace {

// Words longer than this are merged every time: long words are rare and would bloat the cache.
constexpr size_t kMaxCachedWordBytes = 64;
constexpr size_t kMaxCacheEntries = 1 << 16;

std::string Quote(absl::string_view bytes) {
  return absl::StrCat("'", absl::CHexEscape(bytes), "'");
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::vector<std::pair<std::string, int32_t>>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, bool ignore_merges) {
  auto model = std::unique_ptr<BpeModel>(new BpeModel());
  model->ignore_merges_ = ignore_merges;
  model->vocab_.reserve(vocab.size());
  for (const auto& [bytes, id] : vocab) model->vocab_.emplace(bytes, id);
  for (int b = 0; b < 256; ++b) {
    auto it = model->vocab_.find(std::string(1, static_cast<char>(b)));
    if (it == model->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "byte-level BPE vocab has no token for byte 0x", absl::Hex(b, absl::kZeroPad2)));
    }
    model->byte_ids_[b] = it->second;
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = model->vocab_.find(left), r = model->vocab_.find(right);
    auto m = model->vocab_.find(left + right);
    for (auto [it, text] : {std::pair(l, &left), std::pair(r, &right)}) {
      if (it == model->vocab_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("merges[", rank, "] names token ", Quote(*text), " not in the vocab"));
      }
    }
    if (m == model->vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("merges[", rank, "]: merged token ",
                                                     Quote(left + right), " not in the vocab"));
    }
    // A repeated pair keeps its last rank, as Hugging Face's map construction does.
    model->merges_[PairKey(l->second, r->second)] = Merge{static_cast<int32_t>(rank), m->second};
  }
  if (!ignore_merges) model->vocab_.clear();
  return model;
}

void BpeModel::EncodeWord(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    out->push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (auto it = cache_.find(word); it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  MergeWord(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() < kMaxCacheEntries) cache_.emplace(std::string(word), std::move(ids));
  }
}

void BpeModel::MergeWord(absl::string_view word, std::vector<int32_t>* out) const {
  // Symbols form a doubly linked list over the word's bytes; a merge absorbs the right symbol.
  struct Symbol {
    int32_t id;
    int prev;
    int next;
  };
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int n = static_cast<int>(word.size());
  std::vector<Symbol> syms(n);
  for (int i = 0; i < n; ++i) {
    syms[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int pos) {
    int next = syms[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(syms[pos].id, syms[next].id));
    if (it != merges_.end())
      heap.push({it->second.rank, pos, syms[pos].id, syms[next].id, it->second.merged_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = syms[c.pos];
    // Skip candidates made stale by an earlier merge of either side.
    if (!alive[c.pos] || left.id != c.left_id || left.next < 0 ||
        syms[left.next].id != c.right_id) {
      continue;
    }
    int right = left.next;
    left.id = c.merged_id;
    alive[right] = false;
    left.next = syms[right].next;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = syms[i].next) out->push_back(syms[i].id);
}

}  // namespace moe::engine
