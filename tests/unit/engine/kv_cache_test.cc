// Tests of engine/kv_cache.h and engine/kv_storage.h: accounting, prefix reuse, budget
// exhaustion, LRU eviction, and a randomized run that checks every invariant after every operation.
#include "engine/kv_cache.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "engine/kv_storage.h"
#include "gtest/gtest.h"

namespace moe::engine {
namespace {

using kernels::KvFormat;

// Qwen3-30B-A3B: 48 layers, 4 kv heads, head_dim 128.
KvCacheOptions Qwen3Options(KvFormat format, uint64_t budget_bytes, int block_size = 16) {
  KvCacheOptions options;
  options.format = format;
  options.num_layers = 48;
  options.num_kv_heads = 4;
  options.head_dim = 128;
  options.block_size = block_size;
  options.budget_bytes = budget_bytes;
  return options;
}

// A tiny shape (1 layer, 1 head, bf16: 512 bytes per token) so that budgets read as block counts.
KvCacheOptions TinyOptions(int num_blocks, int block_size) {
  KvCacheOptions options;
  options.num_layers = 1;
  options.num_kv_heads = 1;
  options.head_dim = 128;
  options.block_size = block_size;
  options.budget_bytes = uint64_t{512} * block_size * num_blocks;
  return options;
}

std::vector<int32_t> Range(int32_t begin, int32_t count) {
  std::vector<int32_t> v(count);
  for (int32_t i = 0; i < count; ++i) v[i] = begin + i;
  return v;
}

std::vector<int32_t> Table(const KvCache& cache, int64_t seq) {
  absl::StatusOr<absl::Span<const int32_t>> table = cache.BlockTable(seq);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? std::vector<int32_t>(table->begin(), table->end()) : std::vector<int32_t>{};
}

// T10 (capacity half): the block count follows from the budget and the format's bytes per token.
TEST(KvCacheTest, T10CapacityFollowsBudgetAndFormat) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const struct {
    KvFormat format;
    int64_t bytes_per_token;
  } kRows[] = {{KvFormat::kBf16, 98304},  {KvFormat::kFp8E4m3, 50688}, {KvFormat::kTq4, 25344},
               {KvFormat::kTq3p5, 21504}, {KvFormat::kTq3, 19200},     {KvFormat::kTq2p5, 15360},
               {KvFormat::kTq2, 13056}};
  for (const auto& row : kRows) {
    absl::StatusOr<KvCache> cache = KvCache::Create(Qwen3Options(row.format, 10 * kGiB));
    ASSERT_TRUE(cache.ok()) << cache.status();
    const KvCacheStats s = cache->Stats();
    EXPECT_EQ(s.bytes_per_token, row.bytes_per_token) << kernels::KvFormatName(row.format);
    EXPECT_EQ(s.block_bytes, row.bytes_per_token * 16);
    EXPECT_EQ(s.total_blocks, static_cast<int32_t>(10 * kGiB / (row.bytes_per_token * 16)));
    EXPECT_EQ(s.free_blocks, s.total_blocks);
    EXPECT_EQ(s.used_blocks + s.cached_blocks, 0);
    absl::StatusOr<KvStorage> storage =
        KvStorage::Create(row.format, 48, 4, 128, 16, s.total_blocks);
    ASSERT_TRUE(storage.ok()) << storage.status();
    EXPECT_EQ(storage->total_bytes(), int64_t{s.total_blocks} * s.block_bytes);
    EXPECT_LE(storage->total_bytes(), static_cast<int64_t>(10 * kGiB));
  }
  EXPECT_EQ(KvCache::Create(Qwen3Options(KvFormat::kBf16, 1024 * 1024)).status().code(),
            absl::StatusCode::kResourceExhausted);  // 1 MiB < one 1.5 MiB block
  EXPECT_EQ(KvCache::Create(Qwen3Options(KvFormat::kTqProd3, kGiB)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvCache::Create(Qwen3Options(KvFormat::kBf16, kGiB, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The prod formats quantize keys only: refused by name and by value, with the same message.
TEST(CacheFormatTest, ProdFormatsAreNoCacheFormat) {
  EXPECT_EQ(*ParseCacheFormat("tq3.5"), KvFormat::kTq3p5);
  EXPECT_EQ(ParseCacheFormat("int4").status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status by_name = ParseCacheFormat("tq_prod4").status();
  EXPECT_EQ(by_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(by_name.message().find("keys-only test mode"), absl::string_view::npos) << by_name;
  EXPECT_EQ(CheckCacheFormat(KvFormat::kTqProd4), by_name);
  EXPECT_EQ(KvCache::Create(Qwen3Options(KvFormat::kTqProd4, uint64_t{1} << 30)).status(), by_name);
  EXPECT_TRUE(CheckCacheFormat(KvFormat::kBf16).ok());
}

TEST(KvStorageTest, TilesTileTheBufferWithoutOverlap) {
  absl::StatusOr<KvStorage> storage = KvStorage::Create(KvFormat::kTq3, 3, 2, 128, 16, 5);
  ASSERT_TRUE(storage.ok()) << storage.status();
  EXPECT_EQ(storage->tile_bytes(), 50 * 16);
  std::set<int64_t> offsets;
  for (int l = 0; l < 3; ++l) {
    for (int32_t b = 0; b < 5; ++b) {
      for (int h = 0; h < 2; ++h) {
        for (auto role : {kernels::KvRole::kKey, kernels::KvRole::kValue}) {
          const int64_t off = storage->TileOffset(l, b, h, role);
          EXPECT_EQ(off % storage->tile_bytes(), 0);
          EXPECT_LT(off, storage->total_bytes());
          EXPECT_TRUE(offsets.insert(off).second);
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(offsets.size()) * storage->tile_bytes(), storage->total_bytes());
  EXPECT_EQ(storage->TileOffset(1, 0, 0, kernels::KvRole::kKey), storage->layer_bytes());
}

// A second sequence with the same 1,000-token prompt gets 992 cached tokens with block_size 16:
// 1000 = 62·16 + 8, only full blocks are registered, so block 63 (8 tokens) is recomputed.
// Once the first sequence has generated 8 tokens, block 63 is full and registered, and a
// follow-up prompt extending the whole conversation reuses 1,008 tokens.
TEST(KvCacheTest, PrefixReuseOf1000TokenPrompt) {
  absl::StatusOr<KvCache> cache = KvCache::Create(Qwen3Options(KvFormat::kBf16, uint64_t{1} << 30));
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<int32_t> prompt = Range(1000, 1000);
  absl::StatusOr<SequenceBlocks> a = cache->Admit(1, prompt);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_cached_tokens, 0);
  EXPECT_EQ(a->block_table.size(), 63u);
  absl::StatusOr<SequenceBlocks> b = cache->Admit(2, prompt);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->num_cached_tokens, 992);
  EXPECT_TRUE(
      std::equal(a->block_table.begin(), a->block_table.begin() + 62, b->block_table.begin()));
  EXPECT_NE(a->block_table[62], b->block_table[62]);
  EXPECT_EQ(cache->Stats().used_blocks, 64);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();

  const std::vector<int32_t> generated = Range(5000, 8);
  ASSERT_TRUE(cache->AppendTokens(1, generated).ok());
  std::vector<int32_t> follow_up = prompt;
  follow_up.insert(follow_up.end(), generated.begin(), generated.end());
  follow_up.insert(follow_up.end(), {7, 8, 9, 10, 11});
  absl::StatusOr<SequenceBlocks> c = cache->Admit(3, follow_up);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_cached_tokens, 1008);
  // The same 1,008 tokens exactly: the last token must be computed, so 992.
  follow_up.resize(1008);
  absl::StatusOr<SequenceBlocks> d = cache->Admit(4, follow_up);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_cached_tokens, 992);
  // Freed blocks stay cached: sequence 1 finished, a new copy still hits.
  for (int64_t seq : {1, 2, 3, 4}) cache->Free(seq);
  absl::StatusOr<SequenceBlocks> e = cache->Admit(5, prompt);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->num_cached_tokens, 992);
  EXPECT_EQ(cache->Stats().prompt_tokens, 1000 + 1000 + 1013 + 1008 + 1000);
  EXPECT_EQ(cache->Stats().cached_prompt_tokens, 992 + 1008 + 992 + 992);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

// A failed step's blocks: a sequence whose positions 0-63 (blocks 0-3) hold written KV reserves
// 40 more positions (blocks 4 and 5 fill and are registered, 6 is partial) for a step that then
// fails. ForgetUnwritten(64) withdraws 4 and 5, keeps 0-3 reusable, and the sequence's release
// frees 4-6 empty.
TEST(KvCacheTest, ForgetUnwrittenWithdrawsOnlyTheFailedStepsBlocks) {
  absl::StatusOr<KvCache> cache = KvCache::Create(TinyOptions(16, 16));
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::vector<int32_t> prompt = Range(100, 64);
  ASSERT_TRUE(cache->Admit(1, prompt).ok());
  ASSERT_TRUE(cache->AppendTokens(1, Range(500, 40)).ok());
  std::vector<int32_t> longer = prompt;
  for (int32_t t : Range(500, 40)) longer.push_back(t);
  longer.push_back(7);
  EXPECT_EQ(cache->ReusablePrefixBlocks(longer), 6);
  cache->ForgetUnwritten(1, 64);
  EXPECT_EQ(cache->ReusablePrefixBlocks(longer), 4);
  const std::vector<int32_t> table = Table(*cache, 1);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  cache->Free(1);
  for (int b = 0; b < 4; ++b) EXPECT_TRUE(cache->block_state(table[b]).on_lru) << b;
  for (int b = 4; b < 7; ++b) EXPECT_TRUE(cache->block_state(table[b]).on_free_list) << b;
  EXPECT_EQ(cache->ReusablePrefixBlocks(longer), 4);
  cache->ForgetUnwritten(1, 0);  // unknown now: ignored
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST(KvCacheTest, BudgetExhaustionChangesNothing) {
  absl::StatusOr<KvCache> cache = KvCache::Create(TinyOptions(10, 4));
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_EQ(cache->Stats().total_blocks, 10);
  const absl::Status too_big = cache->Admit(1, Range(0, 41)).status();  // 11 blocks
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.message().find("budget of 20480 bytes"), absl::string_view::npos) << too_big;
  EXPECT_EQ(cache->Stats().free_blocks, 10);
  EXPECT_EQ(cache->BlockTable(1).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(cache->Admit(1, Range(0, 30)).ok());           // 8 blocks
  ASSERT_TRUE(cache->AppendTokens(1, Range(100, 10)).ok());  // 40 tokens: 10 blocks
  const std::vector<int32_t> before = Table(*cache, 1);
  EXPECT_EQ(cache->AppendTokens(1, {7}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Table(*cache, 1), before);
  EXPECT_EQ(cache->Admit(2, {1}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->Admit(1, {1}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(cache->Admit(3, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->AppendTokens(9, {1}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
  cache->Free(1);
  cache->Free(1);  // cancel after finish: ignored
  const KvCacheStats s = cache->Stats();
  EXPECT_EQ(s.used_blocks, 0);
  EXPECT_EQ(s.cached_blocks, 10);  // all ten blocks were full and registered
  EXPECT_EQ(s.free_blocks, 0);
  ASSERT_TRUE(cache->Admit(2, Range(500, 40)).ok());  // needs all 10: evicts every cached block
  EXPECT_EQ(cache->Stats().evictions, 10);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

TEST(KvCacheTest, EvictsLeastRecentlyUsedOnlyWhenNoFreeBlock) {
  absl::StatusOr<KvCache> cache = KvCache::Create(TinyOptions(6, 2));
  ASSERT_TRUE(cache.ok()) << cache.status();
  ASSERT_TRUE(cache->Admit(1, Range(0, 4)).ok());   // blocks 0, 1
  ASSERT_TRUE(cache->Admit(2, Range(10, 4)).ok());  // blocks 2, 3
  cache->Free(1);
  cache->Free(2);
  // Tails first: LRU order is 1, 0 (sequence 1), then 3, 2 (sequence 2).
  EXPECT_EQ(cache->LruOrder(), (std::vector<int32_t>{1, 0, 3, 2}));
  ASSERT_TRUE(cache->Admit(3, Range(20, 4)).ok());  // 2 fresh blocks: the free list has 2
  EXPECT_EQ(cache->Stats().evictions, 0);
  EXPECT_EQ(Table(*cache, 3), (std::vector<int32_t>{4, 5}));
  // Reusing sequence 2's first block takes it off the LRU; one fresh block evicts block 1.
  absl::StatusOr<SequenceBlocks> r = cache->Admit(4, {10, 11, 99});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_cached_tokens, 2);
  EXPECT_EQ(r->block_table, (std::vector<int32_t>{2, 1}));
  EXPECT_EQ(cache->Stats().evictions, 1);
  EXPECT_EQ(cache->LruOrder(), (std::vector<int32_t>{0, 3}));
  // Block 1 no longer holds tokens 2, 3: only block 0 of sequence 1's prompt is reused now.
  cache->Free(3);
  r = cache->Admit(5, Range(0, 5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_cached_tokens, 2);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

// Thousands of random admit / append / finish / cancel operations over shared prefixes, with
// every invariant checked after every operation against a model kept by the test.
TEST(KvCacheTest, RandomizedOperationsKeepInvariants) {
  constexpr int kBlockSize = 4;
  constexpr int kOps = 5000;
  absl::StatusOr<KvCache> cache = KvCache::Create(TinyOptions(48, kBlockSize));
  ASSERT_TRUE(cache.ok()) << cache.status();
  const int32_t total = cache->Stats().total_blocks;
  std::mt19937_64 rng(42);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  // A small vocabulary makes equal blocks under different parents common: the chain must tell them
  // apart.
  auto random_tokens = [&](int n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = uniform(0, 7);
    return v;
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 5; ++i) prefixes.push_back(random_tokens(uniform(0, 40)));
  std::map<int64_t, std::vector<int32_t>> live;  // sequence -> its tokens
  int64_t next_id = 0, admitted = 0, refused = 0, appended = 0, cached_tokens = 0;

  for (int op = 0; op < kOps; ++op) {
    SCOPED_TRACE(testing::Message() << "operation " << op);
    const KvCacheStats before = cache->Stats();
    const std::vector<int32_t> lru_before = cache->LruOrder();
    std::set<int32_t> hits;
    int64_t fresh = -1;  // fresh blocks a successful admit/append took
    const int choice = live.empty() ? 0 : uniform(0, 9);
    if (choice < 4) {
      std::vector<int32_t> prompt = prefixes[uniform(0, 4)];
      const std::vector<int32_t> tail = random_tokens(uniform(1, 24));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const int64_t id = next_id++;
      absl::StatusOr<SequenceBlocks> r = cache->Admit(id, prompt);
      if (r.ok()) {
        ++admitted;
        cached_tokens += r->num_cached_tokens;
        EXPECT_EQ(r->num_cached_tokens % kBlockSize, 0);
        EXPECT_LE(r->num_cached_tokens, static_cast<int64_t>(prompt.size()) - 1);
        EXPECT_EQ(r->block_table, Table(*cache, id));
        for (int64_t i = 0; i < r->num_cached_tokens / kBlockSize; ++i)
          hits.insert(r->block_table[i]);
        fresh = static_cast<int64_t>(r->block_table.size()) - r->num_cached_tokens / kBlockSize;
        live[id] = prompt;
      } else {
        ++refused;
        ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      }
    } else if (choice < 8) {
      auto it = std::next(live.begin(), uniform(0, static_cast<int>(live.size()) - 1));
      const std::vector<int32_t> old_table = Table(*cache, it->first);
      const std::vector<int32_t> tokens = random_tokens(uniform(1, 12));
      const absl::Status s = cache->AppendTokens(it->first, tokens);
      if (s.ok()) {
        ++appended;
        it->second.insert(it->second.end(), tokens.begin(), tokens.end());
        fresh = static_cast<int64_t>(Table(*cache, it->first).size() - old_table.size());
      } else {
        ++refused;
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        EXPECT_EQ(Table(*cache, it->first), old_table);
        const int64_t need =
            (static_cast<int64_t>(it->second.size() + tokens.size()) + kBlockSize - 1) /
                kBlockSize -
            static_cast<int64_t>(old_table.size());
        EXPECT_GT(need, before.free_blocks + before.cached_blocks);
      }
    } else {  // finish or cancel: both release the table
      auto it = std::next(live.begin(), uniform(0, static_cast<int>(live.size()) - 1));
      const std::vector<int32_t> table = Table(*cache, it->first);
      cache->Free(it->first);
      live.erase(it);
      // Released registered blocks join the LRU at the recent end, the table's tail first.
      std::vector<int32_t> want = lru_before;
      for (auto b = table.rbegin(); b != table.rend(); ++b) {
        const KvBlockState st = cache->block_state(*b);
        if (st.refcount == 0 && st.registered) want.push_back(*b);
      }
      EXPECT_EQ(cache->LruOrder(), want);
    }
    const KvCacheStats after = cache->Stats();
    if (fresh < 0) {
      EXPECT_EQ(after.evictions, before.evictions);
    } else {
      // Evict only what the free list could not supply, oldest first, never a block just reused.
      const int64_t evicted = after.evictions - before.evictions;
      EXPECT_EQ(evicted, std::max<int64_t>(0, fresh - before.free_blocks));
      std::vector<int32_t> want;
      int64_t dropped = 0;
      for (int32_t b : lru_before) {
        if (hits.count(b) > 0) continue;
        if (dropped < evicted) {
          ++dropped;
          continue;
        }
        want.push_back(b);
      }
      EXPECT_EQ(cache->LruOrder(), want);
    }
    const absl::Status inv = cache->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
    // The model's view: refcounts equal table mentions, one state per block, shared blocks hold
    // the same tokens at the same position behind the same prefix.
    std::vector<int32_t> named(total, 0);
    std::map<int32_t, std::pair<int64_t, int64_t>> first_owner;  // block -> (sequence, position)
    for (const auto& [id, tokens] : live) {
      const std::vector<int32_t> table = Table(*cache, id);
      ASSERT_EQ(static_cast<int64_t>(table.size()),
                (static_cast<int64_t>(tokens.size()) + kBlockSize - 1) / kBlockSize);
      for (int64_t i = 0; i < static_cast<int64_t>(table.size()); ++i) {
        ++named[table[i]];
        auto [owner, inserted] = first_owner.try_emplace(table[i], id, i);
        if (inserted) continue;
        ASSERT_EQ(owner->second.second, i) << "block " << table[i] << " at two positions";
        const std::vector<int32_t>& other = live[owner->second.first];
        ASSERT_TRUE(
            std::equal(tokens.begin(), tokens.begin() + (i + 1) * kBlockSize, other.begin()))
            << "block " << table[i] << " shared by sequences with different prefixes";
      }
    }
    int32_t used = 0, cached = 0, free = 0;
    for (int32_t b = 0; b < total; ++b) {
      const KvBlockState st = cache->block_state(b);
      ASSERT_EQ(st.refcount, named[b]) << "block " << b;
      ASSERT_EQ((st.refcount > 0) + st.on_lru + st.on_free_list, 1) << "block " << b;
      used += st.refcount > 0;
      cached += st.on_lru;
      free += st.on_free_list;
    }
    ASSERT_EQ(used, after.used_blocks);
    ASSERT_EQ(cached, after.cached_blocks);
    ASSERT_EQ(free, after.free_blocks);
    ASSERT_EQ(after.num_sequences, static_cast<int64_t>(live.size()));
  }
  // Every path was exercised.
  EXPECT_GT(admitted, 500);
  EXPECT_GT(refused, 50);
  EXPECT_GT(appended, 500);
  EXPECT_GT(cached_tokens, 1000);
  EXPECT_GT(cache->Stats().evictions, 100);
  std::printf(
      "admitted %lld, refused %lld, appended %lld, cached prompt tokens %lld, evictions %lld\n",
      static_cast<long long>(admitted), static_cast<long long>(refused),
      static_cast<long long>(appended), static_cast<long long>(cached_tokens),
      static_cast<long long>(cache->Stats().evictions));
  // No leak: with every sequence gone, every block is free or cached.
  for (const auto& [id, tokens] : live) cache->Free(id);
  const KvCacheStats end = cache->Stats();
  EXPECT_EQ(end.used_blocks, 0);
  EXPECT_EQ(end.free_blocks + end.cached_blocks, total);
  EXPECT_EQ(end.num_sequences, 0);
  ASSERT_TRUE(cache->CheckInvariants().ok()) << cache->CheckInvariants();
}

}  // namespace
}  // namespace moe::engine
