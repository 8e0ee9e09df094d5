// The "auto" budget rule (engine/budgets.h) on made-up machines, and the facts of a checkpoint.
#include "engine/budgets.h"

#include <filesystem>

#include "gtest/gtest.h"

namespace moe::engine {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(AutoBudgetsTest, EveryExpertInVramWhenTheyFitTheRestToKv) {
  // 80 GiB free: usable = 72 - 4 dense - 2 workspace = 66 GiB; 16 GiB of experts fit in 75%.
  const BudgetFacts f{true, true, 80 * kGiB, 100 * kGiB, 4 * kGiB, 16 * kGiB};
  auto b = AutoBudgets(f);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->device, 16 * kGiB);
  EXPECT_EQ(b->kv, 50 * kGiB);
  EXPECT_EQ(b->host, 0u);
}

TEST(AutoBudgetsTest, ExpertsPastVramGetThreeQuartersAndTheHostTierTheRest) {
  // usable = 72 - 4 - 2 = 66 GiB: device 49.5, KV 16.5; 200 GiB of experts, 150.5 left; RAM/2.
  const BudgetFacts f{true, true, 80 * kGiB, 128 * kGiB, 4 * kGiB, 200 * kGiB};
  auto b = AutoBudgets(f);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->device, 66 * kGiB / 4 * 3);
  EXPECT_EQ(b->device + b->kv, 66 * kGiB);
  EXPECT_EQ(b->host, 64 * kGiB);
}

TEST(AutoBudgetsTest, TooLittleVramIsAnErrorNamingTheSizes) {
  const BudgetFacts f{true, false, 8 * kGiB, 64 * kGiB, 7 * kGiB, 0};
  auto b = AutoBudgets(f);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("set the budgets by hand"), std::string::npos);
}

TEST(AutoBudgetsTest, CpuKeepsTheDefaultsOfBefore) {
  const BudgetFacts f{false, true, 0, 64 * kGiB, kGiB, 8 * kGiB};
  auto b = AutoBudgets(f);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->kv, kCpuKvBudget);
  EXPECT_EQ(b->device, 0u);
  EXPECT_EQ(b->host, 0u);
}

TEST(ModelBudgetFactsTest, ACheckpointLoadsWhole) {
  const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/golden/fixtures/olmoe";
  auto f = ModelBudgetFacts(dir);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->store);
  EXPECT_EQ(f->dense_bytes, std::filesystem::file_size(dir + "/model.safetensors"));
  EXPECT_EQ(f->expert_bytes, 0u);
}

}  // namespace
}  // namespace moe::engine
