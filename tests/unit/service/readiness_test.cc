// Readiness: worker faults in a row turn the worker NOT_SERVING (once, with the reason); a
// success between them resets the count; client errors and the drain behave as documented.
#include "service/worker/readiness.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moe::service {
namespace {

TEST(Readiness, ConsecutiveWorkerFaultsStopServing) {
  Readiness r(3);
  std::vector<std::string> reasons;
  r.SetListener([&](const std::string& why) { reasons.push_back(why); });
  const absl::Status corrupt = absl::DataLossError("blob 000001.blob: checksum mismatch");
  r.RequestEnded(corrupt);
  r.RequestEnded(corrupt);
  r.RequestEnded(absl::OkStatus());  // a success: the worker can serve, start again
  r.RequestEnded(corrupt);
  r.RequestEnded(absl::InvalidArgumentError("max_tokens: too many"));  // the request's fault
  r.RequestEnded(corrupt);
  EXPECT_TRUE(r.serving());
  EXPECT_TRUE(reasons.empty());
  r.RequestEnded(corrupt);
  EXPECT_FALSE(r.serving());
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_NE(reasons[0].find("checksum mismatch"), std::string::npos) << reasons[0];
  EXPECT_EQ(r.reason(), reasons[0]);
  // It does not come back by itself, and says so once.
  r.RequestEnded(absl::OkStatus());
  r.RequestEnded(corrupt);
  r.StartDrain();
  EXPECT_FALSE(r.serving());
  EXPECT_EQ(reasons.size(), 1u);
}

TEST(Readiness, DrainStopsServing) {
  Readiness r(1);
  std::string reason;
  r.SetListener([&](const std::string& why) { reason = why; });
  EXPECT_TRUE(r.serving());
  EXPECT_EQ(r.reason(), "");
  r.StartDrain();
  EXPECT_FALSE(r.serving());
  EXPECT_EQ(reason, "draining");
}

TEST(Readiness, WorkerFaults) {
  EXPECT_TRUE(Readiness::IsWorkerFault(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(Readiness::IsWorkerFault(absl::StatusCode::kInternal));
  EXPECT_FALSE(Readiness::IsWorkerFault(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(Readiness::IsWorkerFault(absl::StatusCode::kResourceExhausted));
  EXPECT_FALSE(Readiness::IsWorkerFault(absl::StatusCode::kCancelled));
}

}  // namespace
}  // namespace moe::service
