// Tokens, TLS credentials and listener options for both processes.
#include "service/security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/status.h"

namespace moe::service {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  MOE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds no token (empty or whitespace only); refusing to serve without auth"));
  }
  return token;
}

absl::Status CheckBearerToken(const grpc::CallbackServerContext& context,
                              const std::string& token) {
  if (token.empty()) return absl::OkStatus();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (!absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError("authorization: the scheme must be Bearer");
  }
  if (!ConstantTimeEquals(value.substr(kScheme.size()), token)) {
    return absl::UnauthenticatedError("wrong bearer token");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFromFiles(
    const std::string& cert_path, const std::string& key_path) {
  if (cert_path.empty() && key_path.empty()) return grpc::InsecureServerCredentials();
  if (cert_path.empty() || key_path.empty()) {
    return absl::InvalidArgumentError("the TLS certificate and key go together");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  MOE_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(cert_path));
  MOE_ASSIGN_OR_RETURN(pair.private_key, ReadFile(key_path));
  if (pair.cert_chain.empty() || pair.private_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS: ", cert_path, " or ", key_path, " is empty"));
  }
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFromFile(
    const std::string& root_ca_path) {
  if (root_ca_path.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  MOE_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(root_ca_path));
  if (ssl.pem_root_certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("TLS: ", root_ca_path, " is empty"));
  }
  return grpc::SslCredentials(ssl);
}

void RefusePortReuse(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

}  // namespace moe::service
