// What both processes need to serve gRPC safely: bearer tokens read from files and checked on
// calls, TLS credentials from PEM files, and a listener that refuses a port already in use.
// Every unusable setting is an error at start (fail closed): a server never runs with less
// protection than its flags asked for.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::service {

// The token in `path`, surrounding whitespace removed. NotFound when the file cannot be read;
// InvalidArgument when it holds no token (empty or whitespace only: auth would be off).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Same-length comparison whose time does not depend on where the strings differ (tokens).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// OK when `token` is empty (auth off) or the call carries "authorization: Bearer <token>" (the
// scheme is case-insensitive, RFC 7235); UNAUTHENTICATED otherwise.
absl::Status CheckBearerToken(const grpc::CallbackServerContext& context, const std::string& token);

// TLS from PEM files when both are given, plaintext when neither is. InvalidArgument when only
// one is; NotFound when a file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const std::string& cert_path, const std::string& key_path);

// TLS that trusts the CA in `root_ca_path`; plaintext when it is empty.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFile(
    const std::string& root_ca_path);

// Options every listening server takes: no SO_REUSEPORT (gRPC's default on Linux), so a second
// process on a port in use fails to start instead of taking a share of its connections.
void RefusePortReuse(grpc::ServerBuilder& builder);

}  // namespace moe::service
