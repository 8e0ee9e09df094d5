// absl::Status <-> grpc::Status: the one place in the project that maps status codes.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>

#include "absl/status/status.h"

namespace moe::service {

// Codes map 1:1 (both follow google.rpc.Code); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Lower-case name of a code as metrics label it ("ok", "invalid_argument", ...).
const char* CodeLabel(absl::StatusCode code);

// Whether a call cancelled at `now` ended because its `deadline` passed (DEADLINE_EXCEEDED, not
// CANCELLED). gRPC fires a deadline on its own clock, which read back through system_clock can
// look a few milliseconds early: the last kDeadlineSlack before the deadline count as past it.
inline constexpr std::chrono::milliseconds kDeadlineSlack{100};
bool DeadlinePassed(std::chrono::system_clock::time_point deadline,
                    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

}  // namespace moe::service
