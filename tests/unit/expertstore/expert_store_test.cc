// expert_store.h: every budget shape returns the checkpoint's bytes; hits are ready at once;
// budgets below one expert are refused; duplicate requests share one load; prefetch is counted.
#include "expertstore/expert_store.h"

#include <chrono>
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "tests/unit/expertstore/store_test_util.h"

namespace moe::store {
namespace {
using testing::ImportTiny;
using testing::SameAsCheckpoint;
using testing::TempDir;

StoreOptions Options(const std::string& dir, uint64_t device_budget, uint64_t host_budget) {
  StoreOptions o;
  o.store_dir = dir;
  o.device_budget_bytes = device_budget;
  o.host_budget_bytes = host_budget;
  // LRU caches every miss: these tests count the tiers' mechanics. The default policy, which
  // may decline to cache a miss, has its own test (NextUseServesAOneOffWithoutEvicting).
  o.policy.name = "lru";
  return o;
}

std::unique_ptr<kernels::Backend> Cpu() {
  return std::move(kernels::MakeBackend(kernels::BackendKind::kCpu, {.num_threads = 1})).value();
}

struct Budgets {
  int device_slots;
  int host_slots;
};

class StoreBudgets : public ::testing::TestWithParam<Budgets> {};

TEST_P(StoreBudgets, EveryExpertComesBackExact) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  const uint64_t slot = 16384;  // the tiny model's blob length
  const StoreOptions options =
      Options(t.store_dir, GetParam().device_slots * slot, GetParam().host_slots * slot);
  auto store = ExpertStore::Open(options, backend.get());
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->slot_bytes(), slot);
  for (int pass = 0; pass < 3; ++pass) {
    for (int32_t l = 0; l < t.model.layers; ++l) {
      const std::vector<int32_t> experts = {3, 0, 2, 1};
      auto handles = (*store)->Acquire(l, experts);
      ASSERT_TRUE(handles.ok()) << handles.status();
      ASSERT_EQ(handles->size(), experts.size());
      for (size_t i = 0; i < experts.size(); ++i) {
        const ExpertHandle& h = (*handles)[i];
        EXPECT_EQ(h.expert, experts[i]);
        ASSERT_TRUE(h.ready.get().ok()) << h.ready.get();
        EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *h.weights, l, experts[i]))
            << "layer " << l << " expert " << experts[i] << " pass " << pass;
      }
    }
  }
  const StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.blob_errors, 0u);
  const int total = t.model.layers * t.model.experts;
  if (GetParam().device_slots >= total) {
    EXPECT_EQ(s.device.misses, static_cast<uint64_t>(total));  // each expert loaded once
    EXPECT_EQ(s.device.hits, static_cast<uint64_t>(2 * total));
    EXPECT_EQ(s.device.evictions, 0u);
  }
  if (GetParam().device_slots == 0 && GetParam().host_slots == 0) {
    EXPECT_EQ(s.blob_reads, static_cast<uint64_t>(3 * total));
    EXPECT_EQ(s.transient_loads, static_cast<uint64_t>(3 * total));
  }
}

INSTANTIATE_TEST_SUITE_P(Budgets, StoreBudgets,
                         ::testing::Values(Budgets{0, 0}, Budgets{2, 0}, Budgets{0, 2},
                                           Budgets{5, 3}, Budgets{3, 12}, Budgets{12, 12}),
                         [](const auto& p) {
                           return "device" + std::to_string(p.param.device_slots) + "_host" +
                                  std::to_string(p.param.host_slots);
                         });

TEST(ExpertStoreTest, HitsAreReadyAtOnce) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 1 << 20, 1 << 20), backend.get());
  ASSERT_TRUE(store.ok());
  {
    auto first = (*store)->Acquire(1, std::vector<int32_t>{2});
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)[0].ready.get().ok());
  }
  auto second = (*store)->Acquire(1, std::vector<int32_t>{2});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ((*second)[0].ready.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ((*store)->Stats().device.hits, 1u);
}

TEST(ExpertStoreTest, CountsBytesPerTierAndLatency) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 1 << 20, 1 << 20), backend.get());
  ASSERT_TRUE(store.ok());
  {
    auto h = (*store)->Acquire(2, std::vector<int32_t>{0, 1, 2});
    ASSERT_TRUE(h.ok());
    for (const auto& x : *h) ASSERT_TRUE(x.ready.get().ok());
  }
  StoreStats s = (*store)->Stats();
  const uint64_t slot = (*store)->slot_bytes();
  EXPECT_EQ(s.device.misses, 3u);
  EXPECT_EQ(s.host.misses, 3u);
  EXPECT_EQ(s.device.bytes_in, 3 * slot);
  EXPECT_EQ(s.host.bytes_in, 3 * slot);
  EXPECT_EQ(s.blob_bytes_read, 3 * slot);
  EXPECT_EQ(s.blob_reads, 3u);
  EXPECT_EQ(s.load_latency_us.count, 3u);
  EXPECT_EQ(s.device.slots, 64);  // 1 MiB / 16 KiB
  EXPECT_EQ(s.device.slot_bytes, slot);
}

TEST(ExpertStoreTest, DuplicateRequestsShareOneLoad) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 1 << 20, 1 << 20), backend.get());
  ASSERT_TRUE(store.ok());
  auto handles = (*store)->Acquire(0, std::vector<int32_t>{1, 1, 1});
  ASSERT_TRUE(handles.ok());
  for (const auto& h : *handles) ASSERT_TRUE(h.ready.get().ok());
  EXPECT_EQ((*store)->Stats().blob_reads, 1u);
  EXPECT_EQ((*store)->Stats().device.misses, 1u);
}

TEST(ExpertStoreTest, BudgetSmallerThanOneExpertIsFailedPrecondition) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  for (const bool device : {true, false}) {
    StoreOptions options = Options(t.store_dir, 0, 0);
    (device ? options.device_budget_bytes : options.host_budget_bytes) = 4096;
    auto store = ExpertStore::Open(options, backend.get());
    ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string msg(store.status().message());
    EXPECT_NE(msg.find(device ? "device budget 4096" : "host budget 4096"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("16384 bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("blobs/000001.blob"), std::string::npos) << msg;
  }
}

TEST(ExpertStoreTest, PrefetchIsCountedWhenUsed) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 1 << 20, 1 << 20), backend.get());
  ASSERT_TRUE(store.ok());
  (*store)->Prefetch(2, std::vector<int32_t>{0, 3});
  auto handles = (*store)->Acquire(2, std::vector<int32_t>{3});
  ASSERT_TRUE(handles.ok());
  ASSERT_TRUE((*handles)[0].ready.get().ok());
  EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *(*handles)[0].weights, 2, 3));
  const StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.prefetch_issued, 2u);
  EXPECT_EQ(s.prefetch_used, 1u);
}

TEST(ExpertStoreTest, HandlesPinTheirSlots) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  // Two device slots, both held: a third expert must not evict them; it gets its own buffer.
  auto store = ExpertStore::Open(Options(t.store_dir, 2 * 16384, 0), backend.get());
  ASSERT_TRUE(store.ok());
  auto held = (*store)->Acquire(0, std::vector<int32_t>{0, 1});
  ASSERT_TRUE(held.ok());
  for (const auto& h : *held) ASSERT_TRUE(h.ready.get().ok());
  auto more = (*store)->Acquire(1, std::vector<int32_t>{0});
  ASSERT_TRUE(more.ok());
  ASSERT_TRUE((*more)[0].ready.get().ok());
  EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *(*more)[0].weights, 1, 0));
  EXPECT_EQ((*store)->Stats().transient_loads, 1u);
  EXPECT_EQ((*store)->Stats().device.evictions, 0u);
  for (const auto& h : *held) EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *h.weights, 0, h.expert));
  held->clear();
  auto after = (*store)->Acquire(1, std::vector<int32_t>{1});
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE((*after)[0].ready.get().ok());
  EXPECT_EQ((*store)->Stats().device.evictions, 1u);
}

// Issue 29: a miss with no free device slot allocated a backend buffer per handle under the
// store's lock (cudaMalloc per miss on CUDA). Now: a bounded pool, allocated once and recycled.
TEST(ExpertStoreTest, TransientBuffersComeFromABoundedPoolAllocatedOnce) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  StoreOptions o = Options(t.store_dir, 0, 0);  // every load is transient
  o.transient_buffers = 2;
  auto store = ExpertStore::Open(o, backend.get());
  ASSERT_TRUE(store.ok()) << store.status();
  std::set<const void*> buffers;
  for (int pass = 0; pass < 3; ++pass) {
    for (int32_t l = 0; l < t.model.layers; ++l) {
      auto handles = (*store)->Acquire(l, std::vector<int32_t>{1, 3});
      ASSERT_TRUE(handles.ok()) << handles.status();
      for (const ExpertHandle& h : *handles) {
        ASSERT_TRUE(h.ready.get().ok()) << h.ready.get();
        EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *h.weights, l, h.expert));
        buffers.insert(h.weights->gate.data);
      }
    }
  }
  EXPECT_EQ(buffers.size(), 2u);  // 18 loads through the same two buffers
  const StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.transient_loads, 18u);
  EXPECT_EQ(s.transient_buffers, 2u);
  // An Acquire may wait a moment: a load lets go of its buffer just after its handle is ready.
  EXPECT_EQ(s.transient_exhausted, 0u);
}

TEST(ExpertStoreTest, ATransientMissWaitsForABufferThenFailsClearly) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  StoreOptions o = Options(t.store_dir, 0, 0);
  o.transient_buffers = 2;
  o.transient_wait_ms = 100;
  auto store = ExpertStore::Open(o, backend.get());
  ASSERT_TRUE(store.ok()) << store.status();

  // More than the pool in one call: it would wait on itself, so it fails at once.
  auto three = (*store)->Acquire(0, std::vector<int32_t>{0, 1, 2});
  ASSERT_TRUE(three.ok());
  EXPECT_TRUE((*three)[0].ready.get().ok());
  EXPECT_TRUE((*three)[1].ready.get().ok());
  absl::Status st = (*three)[2].ready.get();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("transient_buffers"), std::string::npos) << st;
  EXPECT_NE(st.message().find("layer 0, expert 2"), std::string::npos) << st;
  EXPECT_EQ((*store)->Stats().transient_waits, 0u);

  // Both buffers held by this thread; another one's Acquire waits, then fails after the wait.
  std::thread blocked([&] {
    auto h = (*store)->Acquire(1, std::vector<int32_t>{0});
    ASSERT_TRUE(h.ok());
    const absl::Status s = (*h)[0].ready.get();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("all 2 transient buffers"), std::string::npos) << s;
  });
  blocked.join();
  EXPECT_EQ((*store)->Stats().transient_waits, 1u);
  EXPECT_EQ((*store)->Stats().transient_exhausted, 2u);
}

TEST(ExpertStoreTest, ATransientMissIsServedWhenAHolderLetsGo) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  StoreOptions o = Options(t.store_dir, 0, 0);
  o.transient_buffers = 2;
  o.transient_wait_ms = 600000;
  auto store = ExpertStore::Open(o, backend.get());
  ASSERT_TRUE(store.ok()) << store.status();
  auto held = (*store)->Acquire(0, std::vector<int32_t>{0, 1});
  ASSERT_TRUE(held.ok());
  for (const auto& h : *held) ASSERT_TRUE(h.ready.get().ok());
  std::thread waiter([&] {
    auto h = (*store)->Acquire(2, std::vector<int32_t>{3});
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*h)[0].ready.get().ok()) << (*h)[0].ready.get();
    EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *(*h)[0].weights, 2, 3));
  });
  while ((*store)->Stats().transient_waits == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  held->pop_back();  // frees one buffer: the waiter takes it
  waiter.join();
  const StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.transient_waits, 1u);
  EXPECT_EQ(s.transient_exhausted, 0u);
  EXPECT_EQ(s.transient_buffers, 2u);
}

TEST(ExpertStoreTest, PinDeviceResidentPinsOnlyReadyDeviceExpertsAndCountsNothing) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  // Two device slots: experts 0 and 2 of layer 1 resident, then pinned without Acquire.
  auto store = ExpertStore::Open(Options(t.store_dir, 2 * 16384, 0), backend.get());
  ASSERT_TRUE(store.ok());
  {
    auto loaded = (*store)->Acquire(1, std::vector<int32_t>{0, 2});
    ASSERT_TRUE(loaded.ok());
    for (const auto& h : *loaded) ASSERT_TRUE(h.ready.get().ok());
  }
  const StoreStats before = (*store)->Stats();
  std::vector<ExpertHandle> pinned = (*store)->PinDeviceResident(1, 4);
  ASSERT_EQ(pinned.size(), 2u);
  EXPECT_EQ(pinned[0].expert, 0);
  EXPECT_EQ(pinned[1].expert, 2);
  for (const auto& h : pinned) {
    EXPECT_EQ(h.ready.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *h.weights, 1, h.expert));
  }
  EXPECT_EQ((*store)->Stats().device.hits, before.device.hits);
  EXPECT_TRUE((*store)->PinDeviceResident(0, 4).empty()) << "layer 0 has nothing resident";
  EXPECT_TRUE((*store)->PinDeviceResident(7, 4).empty()) << "a layer out of range";
  // Pinned: another expert must not evict them (it gets its own buffer).
  auto other = (*store)->Acquire(0, std::vector<int32_t>{3});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)[0].ready.get().ok());
  EXPECT_EQ((*store)->Stats().device.evictions, 0u);
  for (const auto& h : pinned) EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *h.weights, 1, h.expert));
  pinned.clear();
  auto after = (*store)->Acquire(0, std::vector<int32_t>{1});
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE((*after)[0].ready.get().ok());
  EXPECT_EQ((*store)->Stats().device.evictions, 1u) << "unpinned once the handles went";
}

// Preload: with a device tier that holds every expert, each is loaded once, every layer is then
// readable in full (a decode step can route on the device from its first), and the loads are
// the only misses; with a smaller tier it does nothing.
TEST(ExpertStoreTest, PreloadFillsADeviceTierThatHoldsEveryExpert) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  const int32_t L = t.model.layers, E = t.model.experts;
  auto store = ExpertStore::Open(Options(t.store_dir, uint64_t(L) * E * 16384, 0), backend.get());
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<int32_t> progress;
  auto loaded = (*store)->Preload([&](int32_t done) { progress.push_back(done); });
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(*loaded, int64_t{L} * E);
  EXPECT_EQ(progress, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ((*store)->Stats().device.misses, uint64_t(L) * E);
  for (int32_t l = 0; l < L; ++l) {
    const ExpertStore::ReadableLayer readable = (*store)->PinReadable(l, E);
    ASSERT_TRUE(readable.complete()) << "layer " << l;
    for (int32_t e = 0; e < E; ++e) {
      EXPECT_FALSE(readable.in_host[e]);
      EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, readable.views[e], l, e));
    }
  }

  // One slot short of the model: nothing is loaded.
  auto small =
      ExpertStore::Open(Options(t.store_dir, (uint64_t(L) * E - 1) * 16384, 0), backend.get());
  ASSERT_TRUE(small.ok()) << small.status();
  auto none = (*small)->Preload(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  EXPECT_EQ((*small)->Stats().device.misses, 0u);
}

// Use: every expert the step read from the host tier is a host read; those the device tier held
// by then (loaded since the step made its table, or still loading) are counted apart, and a
// miss is loaded into the device tier for the steps after.
TEST(ExpertStoreTest, UseCountsHostReadsAndThoseTheDeviceTierHeld) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 2 * 16384, 4 * 16384), backend.get());
  ASSERT_TRUE(store.ok());
  {
    auto loaded = (*store)->Acquire(1, std::vector<int32_t>{0});
    ASSERT_TRUE(loaded.ok());
    ASSERT_TRUE((*loaded)[0].ready.get().ok());
  }
  const StoreStats before = (*store)->Stats();
  (*store)->Use(1, std::vector<int32_t>{0, 1, 2}, std::vector<int32_t>{0, 1});
  StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.host_reads - before.host_reads, 2u);
  EXPECT_EQ(s.host_reads_loaded - before.host_reads_loaded, 1u) << "expert 0 was in VRAM";
  EXPECT_EQ(s.device.hits - before.device.hits, 1u);
  EXPECT_EQ(s.device.misses - before.device.misses, 2u) << "experts 1 and 2";
  // The misses load into the device tier (two slots: 0 is the victim of one of them).
  auto again = (*store)->Acquire(1, std::vector<int32_t>{2});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)[0].ready.get().ok());
  s = (*store)->Stats();
  EXPECT_EQ(s.device.hits - before.device.hits, 2u) << "expert 2 came from the Use";
  EXPECT_EQ(s.host_reads_loading, before.host_reads_loading) << "1 and 2 were in no device slot";
}

// The default policy in the store, two device slots: a layer's visits go {0, 1}, {0, 1}, {2}, ...
// Expert 2 never comes back at the next visit, 0 and 1 always do once 2 was used: next_use learns
// it and serves 2 from a transient buffer (a bypass) so that 0 and 1 always hit; LRU evicts one
// of them for 2 every cycle and misses it at the next visit.
TEST(ExpertStoreTest, NextUseServesAOneOffWithoutEvicting) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  for (const std::string policy : {"next_use", "lru"}) {
    StoreOptions o = Options(t.store_dir, 2 * 16384, 0);
    o.policy.name = policy;
    auto store = ExpertStore::Open(o, backend.get());
    ASSERT_TRUE(store.ok()) << store.status();
    StoreStats warm;
    for (int cycle = 0; cycle < 30; ++cycle) {
      if (cycle == 20) warm = (*store)->Stats();
      for (const std::vector<int32_t>& visit :
           {std::vector<int32_t>{0, 1}, std::vector<int32_t>{0, 1}, std::vector<int32_t>{2}}) {
        auto h = (*store)->Acquire(0, visit);
        ASSERT_TRUE(h.ok());
        for (const auto& x : *h) {
          ASSERT_TRUE(x.ready.get().ok());
          EXPECT_TRUE(SameAsCheckpoint(*t.checkpoint, *x.weights, 0, x.expert));
        }
      }
    }
    const StoreStats s = (*store)->Stats();
    const uint64_t hits = s.device.hits - warm.device.hits;  // of 40 uses of 0 and 1
    if (policy == "next_use") {
      EXPECT_EQ(hits, 40u);
      EXPECT_EQ(s.device.bypasses - warm.device.bypasses, 10u);
      EXPECT_EQ(s.device.evictions, warm.device.evictions);
      EXPECT_EQ(s.transient_loads - warm.transient_loads, 10u);
    } else {
      EXPECT_LT(hits, 40u);
      EXPECT_EQ(s.device.bypasses, 0u);
    }
  }
}

TEST(ExpertStoreTest, LayerOutOfRangeIsInvalidArgument) {
  TempDir dir;
  auto t = ImportTiny(dir.path());
  auto backend = Cpu();
  auto store = ExpertStore::Open(Options(t.store_dir, 0, 0), backend.get());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Acquire(3, std::vector<int32_t>{0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto unknown = (*store)->Acquire(0, std::vector<int32_t>{9});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ((*unknown)[0].ready.get().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moe::store
