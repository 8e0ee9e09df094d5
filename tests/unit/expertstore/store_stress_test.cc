// ExpertStore under concurrent Acquire/Prefetch from many threads with tiny budgets (constant
// eviction): no load is lost (every handle becomes ready within a deadline), none is doubled (a
// tier never holds an expert twice: SlotTier::Claim aborts on it), and held slots are never
// overwritten (bytes re-checked just before release). Label "stress": run it under
// ThreadSanitizer as described in tests/README.md.
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "expertstore/expert_store.h"
#include "gtest/gtest.h"
#include "tests/unit/expertstore/store_test_util.h"

namespace moe::store {
namespace {
using testing::ImportTiny;
using testing::SameAsCheckpoint;
using testing::TempDir;

struct StressConfig {
  int device_slots, host_slots;
  const char* policy;
};

class StoreStress : public ::testing::TestWithParam<StressConfig> {};

TEST_P(StoreStress, ConcurrentAcquireLosesAndDoublesNothing) {
  TempDir dir;
  auto t = ImportTiny(dir.path(), /*max_blob_file_bytes=*/4 * 16384);
  auto backend = std::move(kernels::MakeBackend(kernels::BackendKind::kCpu, {})).value();
  StoreOptions o;
  o.store_dir = t.store_dir;
  o.device_budget_bytes = GetParam().device_slots * 16384;
  o.host_budget_bytes = GetParam().host_slots * 16384;
  o.policy.name = GetParam().policy;
  o.io_threads = 4;
  auto store = ExpertStore::Open(o, backend.get());
  ASSERT_TRUE(store.ok()) << store.status();
  constexpr int kThreads = 8, kIterations = 150;
  std::atomic<int> failures{0}, handles_checked{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937 rng(1234 + i);
      for (int it = 0; it < kIterations; ++it) {
        const int32_t layer = static_cast<int32_t>(rng() % t.model.layers);
        if (i == 0 && it % 3 == 0) {
          (*store)->Prefetch((layer + 1) % t.model.layers, std::vector<int32_t>{0, 1});
        }
        std::vector<int32_t> experts(1 + rng() % 3);
        for (int32_t& e : experts) e = static_cast<int32_t>(rng() % t.model.experts);
        auto handles = (*store)->Acquire(layer, experts);
        if (!handles.ok()) {
          ++failures;
          continue;
        }
        for (const ExpertHandle& h : *handles) {
          if (h.ready.wait_for(std::chrono::seconds(20)) != std::future_status::ready ||
              !h.ready.get().ok() ||
              !SameAsCheckpoint(*t.checkpoint, *h.weights, layer, h.expert)) {
            ++failures;
          }
        }
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
        for (const ExpertHandle& h : *handles) {
          if (!SameAsCheckpoint(*t.checkpoint, *h.weights, layer, h.expert)) ++failures;
          ++handles_checked;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(handles_checked.load(), kThreads * kIterations);
  const StoreStats s = (*store)->Stats();
  EXPECT_EQ(s.blob_errors, 0u);
  if (GetParam().device_slots > 0 && GetParam().host_slots > 0) {
    // Every host miss is exactly one blob read; device traffic all came through the host tier.
    EXPECT_EQ(s.blob_reads, s.host.misses);
    EXPECT_GT(s.device.evictions, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, StoreStress,
                         ::testing::Values(StressConfig{3, 5, "lru"},
                                           StressConfig{4, 6, "weighted_lru"},
                                           StressConfig{3, 0, "lfu_aging"},
                                           StressConfig{3, 5, "next_use"},
                                           StressConfig{0, 4, "lru"}, StressConfig{0, 0, "lru"}),
                         [](const auto& p) {
                           return std::string(p.param.policy) + "_device" +
                                  std::to_string(p.param.device_slots) + "_host" +
                                  std::to_string(p.param.host_slots);
                         });

}  // namespace
}  // namespace moe::store
