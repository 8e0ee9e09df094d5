// Paged KV block manager: per-sequence block tables over a fixed pool of blocks sized from a byte
// budget, with prefix reuse through chained block hashes and LRU eviction of unreferenced blocks.
//
// A block holds `block_size` consecutive tokens of one sequence in every layer (block b of layer
// ℓ lives at KvStorage::TileOffset(ℓ, b, ...)). This class manages block indices only; it never
// touches the KV bytes.
//
// Every block is in exactly one state:
//   referenced  refcount > 0: named by that many live block tables;
//   cached      refcount 0, holds a full block whose content hash is registered: reusable by a
//               later prompt with the same prefix, evicted LRU-first when a fresh block is needed;
//   free        refcount 0, no content: on the free list.
// Fresh blocks come from the free list first; a cached block is evicted only when it is empty.
//
// Prefix reuse: when a block fills, it is registered under
//   hash_i = ChainHash(hash_{i−1}, tokens of block i),  hash_{−1} = 0
// (a SplitMix64-style mix, deterministic across processes). Admit walks the prompt's full blocks
// and reuses registered blocks while they match (hash, parent hash and tokens compared), so only
// blocks that are full (and therefore never written again) are ever shared. At most
// (prompt length − 1) / block_size blocks are reused so that the forward pass computes at least
// the last prompt token (its logits give the first output token). Example, block_size 16: a
// second 1,000-token prompt equal to the first reuses 62 blocks = 992 tokens (block 63 holds
// only 8 tokens, is never full at admission and so is never registered).
//
// Ordering contract with the forward pass: blocks are registered as soon as they are full in a
// table, before their KV is written. The engine must write a step's new K/V for the whole batch
// before any attention of that step reads the cache (the usual store-then-attend order), so a
// sequence admitted in the same step as the one filling its prefix reads finished KV.
//
// Not thread-safe: owned by the engine loop.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/kvcodec/kv_quant.h"

namespace moe::engine {

struct KvCacheOptions {
  kernels::KvFormat format = kernels::KvFormat::kBf16;
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;        // tokens per block. Default: 16.
  uint64_t budget_bytes = 0;  // bytes of KV storage; the block count follows from it.
  bool prefix_reuse = true;   // Default: true.

  // InvalidArgument naming the bad field, or the format when it is no cache format
  // (CheckCacheFormat, engine/kv_storage.h).
  absl::Status Validate() const;
};

struct SequenceBlocks {
  std::vector<int32_t> block_table;  // block index per block_size tokens of the sequence
  int64_t num_cached_tokens = 0;     // leading prompt tokens whose KV is already in the cache
};

struct KvCacheStats {
  int64_t bytes_per_token = 0;  // all layers, K and V
  int64_t block_bytes = 0;      // bytes_per_token · block_size
  int32_t total_blocks = 0;
  int32_t used_blocks = 0;    // referenced
  int32_t cached_blocks = 0;  // unreferenced, reusable, evictable
  int32_t free_blocks = 0;    // empty
  int64_t num_sequences = 0;
  int64_t prompt_tokens = 0;         // admitted, cumulative
  int64_t cached_prompt_tokens = 0;  // of which served from the cache
  int64_t evictions = 0;
};

// Introspection for tests and debugging.
struct KvBlockState {
  int32_t refcount = 0;
  bool registered = false;  // content hash registered for reuse
  bool on_free_list = false;
  bool on_lru = false;
};

class KvCache {
 public:
  // InvalidArgument for bad options; ResourceExhausted when the budget holds no block.
  static absl::StatusOr<KvCache> Create(const KvCacheOptions& options);

  // Allocates the table for a new sequence's prompt, reusing cached prefix blocks.
  // AlreadyExists if seq_id is live; InvalidArgument for an empty prompt; ResourceExhausted
  // naming the budget when the prompt does not fit (nothing changes then).
  absl::StatusOr<SequenceBlocks> Admit(int64_t seq_id, absl::Span<const int32_t> prompt_tokens);
  // Extends a live sequence by generated tokens, growing its table. NotFound for an unknown
  // sequence; ResourceExhausted when the blocks run out (nothing changes then).
  absl::Status AppendTokens(int64_t seq_id, absl::Span<const int32_t> tokens);
  // Full blocks at the start of `tokens` that Admit would reuse now (same rule: registered,
  // matching, at most (size − 1) / block_size). Changes nothing. The engine admits only that
  // prefix plus one token and appends the rest as it is computed, so a block is registered in
  // the step that writes its KV, never earlier.
  int64_t ReusablePrefixBlocks(absl::Span<const int32_t> tokens) const;
  // Moves a live sequence to a new id (a kept session's blocks continuing in its next turn).
  // NotFound for an unknown `from`, AlreadyExists for a live `to`.
  absl::Status Rename(int64_t from, int64_t to);
  // Releases a sequence (finished or cancelled); its registered blocks stay cached. Unknown ids
  // are ignored, so a cancel racing a finish is harmless.
  void Free(int64_t seq_id);
  // Withdraws from prefix reuse the live sequence's blocks that hold any position >= `position`,
  // registered before their KV was written (the ordering contract above) by a step that then
  // failed: a later prompt would read KV that was never written. Unknown ids are ignored.
  void ForgetUnwritten(int64_t seq_id, int64_t position);

  // The live sequence's table (valid until the next mutating call); NotFound otherwise.
  absl::StatusOr<absl::Span<const int32_t>> BlockTable(int64_t seq_id) const;
  KvCacheStats Stats() const;
  const KvCacheOptions& options() const { return options_; }

  KvBlockState block_state(int32_t block) const;
  std::vector<int32_t> LruOrder() const;  // cached blocks, least recently used first
  // Internal naming the first broken invariant (the states above, refcounts, hash index, LRU
  // links, table sizes); OK otherwise. O(blocks + tokens): for tests.
  absl::Status CheckInvariants() const;

 private:
  struct Block {
    int32_t refcount = 0;
    bool registered = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // content while registered (collision check)
    bool on_free_list = false;
    bool on_lru = false;
    int32_t lru_prev = -1;
    int32_t lru_next = -1;
  };
  struct Sequence {
    std::vector<int32_t> table;
    int64_t num_tokens = 0;
    uint64_t last_hash = 0;        // hash of the last full block (0 before the first)
    std::vector<int32_t> partial;  // tokens of the trailing, not yet full block
  };

  explicit KvCache(const KvCacheOptions& options) : options_(options) {}
  int32_t available_blocks() const { return static_cast<int32_t>(free_list_.size()) + lru_size_; }
  int32_t TakeFreshBlock();
  void Release(int32_t block);
  void Register(int32_t block, uint64_t parent_hash, uint64_t hash,
                absl::Span<const int32_t> tokens);
  void LruPushBack(int32_t block);
  void LruRemove(int32_t block);
  absl::Status NoRoom(int64_t seq_id, int64_t need) const;

  KvCacheOptions options_;
  KvCacheStats stats_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;  // a stack
  int32_t lru_head_ = -1;           // least recently used
  int32_t lru_tail_ = -1;
  int32_t lru_size_ = 0;
  absl::flat_hash_map<uint64_t, int32_t> registry_;  // content hash -> cached or referenced block
  absl::flat_hash_map<int64_t, Sequence> sequences_;
};

// The chained content hash of one block (see above).
uint64_t ChainHash(uint64_t parent_hash, absl::Span<const int32_t> tokens);

}  // namespace moe::engine
