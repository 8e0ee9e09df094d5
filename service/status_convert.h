// absl::Status <-> grpc::Status: the one place in the project that maps status codes.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace moe::service {

// Codes map 1:1 (both follow google.rpc.Code); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Lower-case name of a code as metrics label it ("ok", "invalid_argument", ...).
const char* CodeLabel(absl::StatusCode code);

}  // namespace moe::service
