// Paged KV block manager: free list, reference counts, prefix registry and LRU of cached blocks.
#include "engine/kv_cache.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/kv_storage.h"
#include "kernels/base/check.h"
#include "kernels/base/status.h"

namespace moe::engine {
namespace {

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// Chained: a block's hash covers every token before it, so one registry lookup per block finds
// a prefix, never the same block content after a different history (whose KV would differ).
uint64_t ChainHash(uint64_t parent_hash, absl::Span<const int32_t> tokens) {
  uint64_t h = Mix64(parent_hash + 0x9e3779b97f4a7c15ull);
  for (int32_t t : tokens) h = Mix64(h ^ static_cast<uint32_t>(t));
  return h;
}

absl::Status KvCacheOptions::Validate() const {
  auto bad = [](absl::string_view field, auto value, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache option ", field, " = ", value, ": ", want));
  };
  if (num_layers <= 0) return bad("num_layers", num_layers, "must be > 0");
  if (num_kv_heads <= 0) return bad("num_kv_heads", num_kv_heads, "must be > 0");
  if (block_size <= 0) return bad("block_size", block_size, "must be > 0");
  MOE_RETURN_IF_ERROR(CheckCacheFormat(format));
  return kernels::KvBytesPerVector(format, head_dim).status();
}

absl::StatusOr<KvCache> KvCache::Create(const KvCacheOptions& options) {
  MOE_RETURN_IF_ERROR(options.Validate());
  MOE_ASSIGN_OR_RETURN(const int64_t bytes_per_token,
                       kernels::KvBytesPerToken(options.format, options.head_dim,
                                                options.num_kv_heads, options.num_layers));
  const int64_t block_bytes = bytes_per_token * options.block_size;
  const uint64_t num_blocks = options.budget_bytes / static_cast<uint64_t>(block_bytes);
  if (num_blocks == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache budget of ", options.budget_bytes, " bytes holds no block of ",
                     block_bytes, " bytes (", options.block_size, " tokens × ", bytes_per_token,
                     " bytes/token, ", kernels::KvFormatName(options.format), ")"));
  }
  if (num_blocks > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget of ", options.budget_bytes,
                                                   " bytes gives ", num_blocks,
                                                   " blocks, more than int32 block ids allow"));
  }
  KvCache cache(options);
  cache.stats_.bytes_per_token = bytes_per_token;
  cache.stats_.block_bytes = block_bytes;
  cache.stats_.total_blocks = static_cast<int32_t>(num_blocks);
  cache.blocks_.resize(num_blocks);
  for (int32_t b = static_cast<int32_t>(num_blocks) - 1; b >= 0; --b) {
    cache.free_list_.push_back(b);  // block 0 is handed out first
    cache.blocks_[b].on_free_list = true;
  }
  return cache;
}

absl::Status KvCache::NoRoom(int64_t seq_id, int64_t need) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "KV cache budget of ", options_.budget_bytes, " bytes (", stats_.total_blocks, " blocks of ",
      options_.block_size, " tokens, ", kernels::KvFormatName(options_.format),
      ") is full: sequence ", seq_id, " needs ", need, " more blocks, ", available_blocks(),
      " are free or evictable"));
}

absl::StatusOr<SequenceBlocks> KvCache::Admit(int64_t seq_id,
                                              absl::Span<const int32_t> prompt_tokens) {
  if (sequences_.contains(seq_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("KV cache: sequence ", seq_id, " is already admitted"));
  }
  if (prompt_tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache: sequence ", seq_id, " has an empty prompt"));
  }
  const int64_t bs = options_.block_size;
  const int64_t len = static_cast<int64_t>(prompt_tokens.size());
  const int64_t num_full = len / bs;
  std::vector<uint64_t> hashes(num_full);
  for (int64_t i = 0; i < num_full; ++i) {
    hashes[i] = ChainHash(i == 0 ? 0 : hashes[i - 1], prompt_tokens.subspan(i * bs, bs));
  }
  // Longest registered prefix, leaving at least the last prompt token to compute: the step must
  // run it to get the logits the first output token is sampled from.
  std::vector<int32_t> hits;
  const int64_t max_reuse = options_.prefix_reuse ? (len - 1) / bs : 0;
  int32_t hits_on_lru = 0;
  for (int64_t i = 0; i < max_reuse; ++i) {
    auto it = registry_.find(hashes[i]);
    if (it == registry_.end()) break;
    const Block& block = blocks_[it->second];
    const auto content = prompt_tokens.subspan(i * bs, bs);
    if (block.parent_hash != (i == 0 ? 0 : hashes[i - 1]) ||
        !std::equal(block.tokens.begin(), block.tokens.end(), content.begin(), content.end())) {
      break;  // a 64-bit hash collision: treat as a miss
    }
    hits.push_back(it->second);
    hits_on_lru += block.refcount == 0 ? 1 : 0;
  }
  const int64_t num_blocks = CeilDiv(len, bs);
  const int64_t fresh = num_blocks - static_cast<int64_t>(hits.size());
  // available_blocks() counts cached (LRU) blocks as evictable, but the hits among them are about
  // to be referenced by this sequence, so they cannot also serve as its fresh blocks.
  if (fresh > available_blocks() - hits_on_lru) return NoRoom(seq_id, fresh);

  Sequence seq;
  // Reference the hits before taking fresh blocks: TakeFreshBlock evicts from the LRU, which must
  // not hand out a block this sequence is about to reuse.
  for (int32_t b : hits) {
    if (blocks_[b].refcount++ == 0) LruRemove(b);
    seq.table.push_back(b);
  }
  for (int64_t i = static_cast<int64_t>(hits.size()); i < num_blocks; ++i) {
    const int32_t b = TakeFreshBlock();
    seq.table.push_back(b);
    if (i < num_full)
      Register(b, i == 0 ? 0 : hashes[i - 1], hashes[i], prompt_tokens.subspan(i * bs, bs));
  }
  seq.num_tokens = len;
  seq.last_hash = num_full > 0 ? hashes[num_full - 1] : 0;
  seq.partial.assign(prompt_tokens.begin() + num_full * bs, prompt_tokens.end());
  SequenceBlocks result{seq.table, static_cast<int64_t>(hits.size()) * bs};
  sequences_.emplace(seq_id, std::move(seq));
  stats_.prompt_tokens += len;
  stats_.cached_prompt_tokens += result.num_cached_tokens;
  return result;
}

absl::Status KvCache::AppendTokens(int64_t seq_id, absl::Span<const int32_t> tokens) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: sequence ", seq_id, " is not admitted"));
  }
  Sequence& seq = it->second;
  const int64_t bs = options_.block_size;
  const int64_t new_total = seq.num_tokens + static_cast<int64_t>(tokens.size());
  const int64_t grow = CeilDiv(new_total, bs) - static_cast<int64_t>(seq.table.size());
  // Checked before anything changes: a refused append leaves the sequence as it was, so the
  // engine can preempt another sequence and try again.
  if (grow > available_blocks()) return NoRoom(seq_id, grow);
  for (int64_t i = 0; i < grow; ++i) seq.table.push_back(TakeFreshBlock());
  for (int32_t t : tokens) {
    seq.partial.push_back(t);
    ++seq.num_tokens;
    if (static_cast<int64_t>(seq.partial.size()) == bs) {
      const uint64_t hash = ChainHash(seq.last_hash, seq.partial);
      Register(seq.table[seq.num_tokens / bs - 1], seq.last_hash, hash, seq.partial);
      seq.last_hash = hash;
      seq.partial.clear();
    }
  }
  return absl::OkStatus();
}

int64_t KvCache::ReusablePrefixBlocks(absl::Span<const int32_t> tokens) const {
  if (!options_.prefix_reuse || tokens.empty()) return 0;
  const int64_t bs = options_.block_size;
  const int64_t max_reuse = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  uint64_t parent = 0;
  int64_t i = 0;
  for (; i < max_reuse; ++i) {
    const auto content = tokens.subspan(i * bs, bs);
    const uint64_t hash = ChainHash(parent, content);
    auto it = registry_.find(hash);
    if (it == registry_.end()) break;
    const Block& block = blocks_[it->second];
    if (block.parent_hash != parent ||
        !std::equal(block.tokens.begin(), block.tokens.end(), content.begin(), content.end())) {
      break;
    }
    parent = hash;
  }
  return i;
}

absl::Status KvCache::Rename(int64_t from, int64_t to) {
  auto it = sequences_.find(from);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: sequence ", from, " is not admitted"));
  }
  if (sequences_.contains(to)) {
    return absl::AlreadyExistsError(absl::StrCat("KV cache: sequence ", to, " is already admitted"));
  }
  Sequence seq = std::move(it->second);
  sequences_.erase(it);
  sequences_.emplace(to, std::move(seq));
  return absl::OkStatus();
}

void KvCache::Free(int64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  // Release the tail first: the LRU then evicts a sequence's last blocks before its first ones,
  // and a prefix is only reusable while all its earlier blocks survive.
  const std::vector<int32_t>& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) Release(*b);
  sequences_.erase(it);
}

void KvCache::ForgetUnwritten(int64_t seq_id, int64_t position) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  const std::vector<int32_t>& table = it->second.table;
  for (size_t i = static_cast<size_t>(position / options_.block_size); i < table.size(); ++i) {
    Block& block = blocks_[table[i]];
    if (!block.registered) continue;
    registry_.erase(block.hash);
    block.registered = false;
    block.tokens.clear();
  }
}

int32_t KvCache::TakeFreshBlock() {
  int32_t b;
  // A free block first: evicting a cached one throws away a prefix a later request might reuse.
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
    blocks_[b].on_free_list = false;
  } else {
    MOE_CHECK(lru_head_ >= 0) << "no free or cached block; callers check available_blocks()";
    b = lru_head_;
    LruRemove(b);
    Block& victim = blocks_[b];
    registry_.erase(victim.hash);
    victim.registered = false;
    victim.tokens.clear();
    ++stats_.evictions;
  }
  blocks_[b].refcount = 1;
  return b;
}

void KvCache::Release(int32_t b) {
  Block& block = blocks_[b];
  MOE_CHECK(block.refcount > 0) << "block " << b << " released more often than referenced";
  if (--block.refcount > 0) return;
  if (block.registered) {
    LruPushBack(b);
  } else {
    block.on_free_list = true;
    free_list_.push_back(b);
  }
}

void KvCache::Register(int32_t b, uint64_t parent_hash, uint64_t hash,
                       absl::Span<const int32_t> tokens) {
  if (!options_.prefix_reuse) return;
  // An equal block may already be registered (the last-token cap, or two sequences that filled
  // the same content at once): keep that one; this block stays unregistered and is freed empty.
  if (!registry_.emplace(hash, b).second) return;
  Block& block = blocks_[b];
  block.registered = true;
  block.hash = hash;
  block.parent_hash = parent_hash;
  block.tokens.assign(tokens.begin(), tokens.end());
}

void KvCache::LruPushBack(int32_t b) {
  Block& block = blocks_[b];
  block.on_lru = true;
  block.lru_prev = lru_tail_;
  block.lru_next = -1;
  if (lru_tail_ >= 0)
    blocks_[lru_tail_].lru_next = b;
  else
    lru_head_ = b;
  lru_tail_ = b;
  ++lru_size_;
}

void KvCache::LruRemove(int32_t b) {
  Block& block = blocks_[b];
  MOE_CHECK(block.on_lru) << "block " << b << " is not on the LRU list";
  if (block.lru_prev >= 0)
    blocks_[block.lru_prev].lru_next = block.lru_next;
  else
    lru_head_ = block.lru_next;
  if (block.lru_next >= 0)
    blocks_[block.lru_next].lru_prev = block.lru_prev;
  else
    lru_tail_ = block.lru_prev;
  block.on_lru = false;
  block.lru_prev = block.lru_next = -1;
  --lru_size_;
}

absl::StatusOr<absl::Span<const int32_t>> KvCache::BlockTable(int64_t seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("KV cache: sequence ", seq_id, " is not admitted"));
  }
  return absl::Span<const int32_t>(it->second.table);
}

KvCacheStats KvCache::Stats() const {
  KvCacheStats s = stats_;
  s.free_blocks = static_cast<int32_t>(free_list_.size());
  s.cached_blocks = lru_size_;
  s.used_blocks = s.total_blocks - s.free_blocks - s.cached_blocks;
  s.num_sequences = static_cast<int64_t>(sequences_.size());
  return s;
}

KvBlockState KvCache::block_state(int32_t b) const {
  MOE_CHECK(b >= 0 && b < stats_.total_blocks) << "block " << b << " of " << stats_.total_blocks;
  const Block& block = blocks_[b];
  return {block.refcount, block.registered, block.on_free_list, block.on_lru};
}

std::vector<int32_t> KvCache::LruOrder() const {
  std::vector<int32_t> order;
  for (int32_t b = lru_head_; b >= 0; b = blocks_[b].lru_next) order.push_back(b);
  return order;
}

absl::Status KvCache::CheckInvariants() const {
  auto broken = [](auto&&... parts) {
    return absl::InternalError(absl::StrCat("KV cache invariant: ", parts...));
  };
  const int32_t n = stats_.total_blocks;
  std::vector<int32_t> named(n, 0);
  const int64_t bs = options_.block_size;
  for (const auto& [id, seq] : sequences_) {
    if (static_cast<int64_t>(seq.table.size()) != CeilDiv(seq.num_tokens, bs)) {
      return broken("sequence ", id, " has ", seq.table.size(), " blocks for ", seq.num_tokens,
                    " tokens");
    }
    if (static_cast<int64_t>(seq.partial.size()) != seq.num_tokens % bs) {
      return broken("sequence ", id, " partial block holds ", seq.partial.size(), " tokens");
    }
    for (int32_t b : seq.table) ++named[b];
    if (!seq.partial.empty()) {  // the block being written is private and unregistered
      const Block& last = blocks_[seq.table.back()];
      if (last.refcount != 1 || last.registered) {
        return broken("sequence ", id, " writes block ", seq.table.back(), " with refcount ",
                      last.refcount, (last.registered ? ", registered" : ""));
      }
    }
  }
  std::vector<int32_t> on_free(n, 0);
  for (int32_t b : free_list_) ++on_free[b];
  int32_t lru_count = 0;
  for (int32_t b = lru_head_, prev = -1; b >= 0; prev = b, b = blocks_[b].lru_next) {
    if (blocks_[b].lru_prev != prev || !blocks_[b].on_lru) return broken("LRU links at block ", b);
    if (++lru_count > n) return broken("LRU list has a cycle");
  }
  if (lru_count != lru_size_) return broken("LRU size ", lru_size_, " but ", lru_count, " linked");
  for (int32_t b = 0; b < n; ++b) {
    const Block& block = blocks_[b];
    if (block.refcount != named[b]) {
      return broken("block ", b, " refcount ", block.refcount, " but named by ", named[b],
                    " tables");
    }
    const bool referenced = block.refcount > 0;
    const bool cached = !referenced && block.on_lru;
    const bool free = !referenced && on_free[b] == 1;
    if (referenced + cached + free != 1 || on_free[b] > 1 ||
        block.on_free_list != (on_free[b] == 1) ||
        (referenced && (block.on_lru || on_free[b] > 0)) || (block.on_lru && on_free[b] > 0)) {
      return broken("block ", b, " is not exactly one of referenced/cached/free (refcount ",
                    block.refcount, ", lru ", block.on_lru, ", free list ", on_free[b], ")");
    }
    if (cached && !block.registered) return broken("cached block ", b, " is not registered");
    if (free && block.registered) return broken("free block ", b, " is still registered");
    if (block.registered) {
      auto it = registry_.find(block.hash);
      if (it == registry_.end() || it->second != b)
        return broken("block ", b, " missing from the registry");
      if (static_cast<int64_t>(block.tokens.size()) != bs)
        return broken("block ", b, " content size");
    }
  }
  for (const auto& [hash, b] : registry_) {
    if (!blocks_[b].registered || blocks_[b].hash != hash)
      return broken("registry entry for block ", b);
  }
  return absl::OkStatus();
}

}  // namespace moe::engine
