// StatePool: owned slots come from the free list first, then from the LRU snapshot; snapshots
// copy the bytes and are found by hash; the counts add up.
#include "engine/state_pool.h"

#include <cstring>

#include "gtest/gtest.h"

namespace moe::engine {
namespace {

constexpr int64_t kStateBytes = 100;  // a fake state size: not a multiple of the alignment

class StatePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::move(*kernels::MakeBackend(kernels::BackendKind::kCpu, {}));
  }
  std::unique_ptr<StatePool> Make(int64_t slots) {
    auto pool = StatePool::Create(*backend_, kStateBytes, slots);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return std::move(pool).value();
  }
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(StatePoolTest, SlotsAreAlignedAndCounted) {
  EXPECT_EQ(StatePool::SlotBytes(100), kStateSlotAlign);
  EXPECT_EQ(StatePool::SlotBytes(kStateSlotAlign + 1), 2 * kStateSlotAlign);
  auto pool = Make(3);
  StatePoolStats s = pool->Stats();
  EXPECT_EQ(s.total_slots, 3);
  EXPECT_EQ(s.free_slots, 3);
  EXPECT_EQ(s.owned_slots, 0);
  EXPECT_EQ(s.slot_bytes, kStateSlotAlign);
  const int32_t a = pool->Acquire(), b = pool->Acquire();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_NE(a, b);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(pool->data(b)) - reinterpret_cast<uint8_t*>(pool->data(a)),
            (b - a) * kStateSlotAlign);
  EXPECT_EQ(pool->Stats().owned_slots, 2);
  pool->Release(a);
  EXPECT_EQ(pool->Stats().owned_slots, 1);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

TEST_F(StatePoolTest, BadSizesAreRefused) {
  EXPECT_EQ(StatePool::Create(*backend_, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatePool::Create(*backend_, 64, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(StatePoolTest, ExhaustionReturnsMinusOneUntilARelease) {
  auto pool = Make(2);
  const int32_t a = pool->Acquire();
  const int32_t b = pool->Acquire();
  EXPECT_EQ(pool->Acquire(), -1);
  EXPECT_FALSE(pool->TakeSnapshot(1, a));  // no slot for a snapshot either
  pool->Release(b);
  EXPECT_EQ(pool->Acquire(), b);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

TEST_F(StatePoolTest, ZeroAndSnapshotCopyTheBytes) {
  auto pool = Make(3);
  const int32_t a = pool->Acquire();
  std::memset(pool->data(a), 0x5a, kStateBytes);
  ASSERT_TRUE(pool->TakeSnapshot(42, a));
  EXPECT_FALSE(pool->TakeSnapshot(42, a));  // registered already
  const int32_t snap = pool->FindSnapshot(42);
  ASSERT_GE(snap, 0);
  EXPECT_EQ(pool->FindSnapshot(43), -1);
  pool->Zero(a);
  const int32_t b = pool->Acquire();
  pool->CopyFrom(b, snap);
  const auto* bytes = reinterpret_cast<const uint8_t*>(pool->data(b));
  const auto* zeroed = reinterpret_cast<const uint8_t*>(pool->data(a));
  for (int64_t i = 0; i < kStateBytes; ++i) {
    ASSERT_EQ(bytes[i], 0x5a) << i;
    ASSERT_EQ(zeroed[i], 0) << i;
  }
  StatePoolStats s = pool->Stats();
  EXPECT_EQ(s.snapshots, 1);
  EXPECT_EQ(s.owned_slots, 2);
  EXPECT_EQ(s.snapshots_taken, 1);
  EXPECT_EQ(s.snapshot_hits, 1);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

TEST_F(StatePoolTest, OwnersEvictTheLeastRecentlyUsedSnapshot) {
  auto pool = Make(4);
  const int32_t owner = pool->Acquire();
  ASSERT_TRUE(pool->TakeSnapshot(1, owner));
  ASSERT_TRUE(pool->TakeSnapshot(2, owner));
  ASSERT_TRUE(pool->TakeSnapshot(3, owner));  // the pool is full now
  EXPECT_EQ(pool->SnapshotLru(), (std::vector<uint64_t>{1, 2, 3}));
  const int32_t reader = pool->Acquire();  // evicts 1
  ASSERT_GE(reader, 0);
  EXPECT_EQ(pool->FindSnapshot(1), -1);
  pool->CopyFrom(reader, pool->FindSnapshot(2));  // 2 becomes the most recent
  EXPECT_EQ(pool->SnapshotLru(), (std::vector<uint64_t>{3, 2}));
  // A new snapshot replaces the LRU one when no slot is free.
  ASSERT_TRUE(pool->TakeSnapshot(4, owner));
  EXPECT_EQ(pool->SnapshotLru(), (std::vector<uint64_t>{2, 4}));
  // `keep` protects one snapshot: the other goes.
  const int32_t keep = pool->FindSnapshot(2);
  EXPECT_GE(pool->Acquire(keep), 0);
  EXPECT_EQ(pool->SnapshotLru(), (std::vector<uint64_t>{2}));
  EXPECT_EQ(pool->Acquire(keep), -1);  // only the kept one is left
  EXPECT_GE(pool->Acquire(), 0);       // without `keep` it goes too
  EXPECT_EQ(pool->Stats().snapshots, 0);
  EXPECT_EQ(pool->Stats().snapshot_evictions, 4);
  EXPECT_EQ(pool->Stats().owned_slots, 4);
  EXPECT_TRUE(pool->CheckInvariants().ok()) << pool->CheckInvariants();
}

}  // namespace
}  // namespace moe::engine
