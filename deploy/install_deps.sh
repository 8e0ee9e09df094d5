#!/usr/bin/env bash
# Installs the Debian packages the project builds, tests and serves with. Idempotent: when every
# package is already there it prints nothing and changes nothing. Usage: deploy/install_deps.sh
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  librocksdb-dev liburing-dev libxxhash-dev prometheus-cpp-dev nlohmann-json3-dev
  libcpp-httplib-dev      # the frontend's OpenAI/Anthropic HTTP API (--http_listen)
  libgtest-dev libgmock-dev libbenchmark-dev
  unicode-data            # UnicodeData.txt: NFC and character classes for the tokenizer
  python3 python3-grpcio python3-protobuf  # the Python client in the integration tests
  python3-yaml            # tests/deploy reads the rendered Kubernetes manifests
  openssl                 # the TLS test's self-signed certificate
  prometheus              # promtool and the real server the metrics tests query
  clang libclang-rt-14-dev  # tests/fuzz: clang 14 and its libFuzzer/ASan/UBSan runtimes
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Test-only JavaScript needs node and npm; a machine that has them from elsewhere keeps its own.
command -v npm >/dev/null || missing+=(nodejs npm)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
