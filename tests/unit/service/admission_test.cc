// Admission: slots run at once, the bounded queue waits in order, the rest is refused.
#include "service/frontend/admission.h"

#include <gtest/gtest.h>

#include <vector>

namespace moe::service {
namespace {

TEST(Admission, RunsQueuesAndRefuses) {
  std::vector<int> started;
  int64_t last_running = -1, last_queued = -1;
  Admission a({/*max_running=*/2, /*max_queued=*/1}, [&](int64_t r, int64_t q) {
    last_running = r;
    last_queued = q;
  });
  ASSERT_TRUE(a.Enter([&] { started.push_back(1); }).ok());
  ASSERT_TRUE(a.Enter([&] { started.push_back(2); }).ok());
  ASSERT_TRUE(a.Enter([&] { started.push_back(3); }).ok());
  EXPECT_EQ(started, (std::vector<int>{1, 2}));
  EXPECT_EQ(last_running, 2);
  EXPECT_EQ(last_queued, 1);
  const absl::StatusOr<uint64_t> full = a.Enter([&] { started.push_back(4); });
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("queue is full"), std::string::npos);
  a.Leave();  // the slot passes to the queued call
  EXPECT_EQ(started, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(a.running(), 2);
  EXPECT_EQ(a.queued(), 0);
  a.Leave();
  a.Leave();
  EXPECT_EQ(a.running(), 0);
}

TEST(Admission, WithdrawTakesAQueuedCallOut) {
  Admission a({1, 4}, nullptr);
  ASSERT_TRUE(a.Enter([] {}).ok());
  bool ran = false;
  const absl::StatusOr<uint64_t> t = a.Enter([&] { ran = true; });
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(a.Withdraw(*t));
  EXPECT_FALSE(a.Withdraw(*t));
  a.Leave();
  EXPECT_FALSE(ran);
  EXPECT_EQ(a.running(), 0);
}

TEST(Admission, ClosedRefusesWithUnavailable) {
  Admission a({1, 1}, nullptr);
  a.Close();
  EXPECT_EQ(a.Enter([] {}).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moe::service
