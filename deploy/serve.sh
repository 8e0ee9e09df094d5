#!/usr/bin/env bash
# The first README command: installs what is missing, builds, and runs the built-in default model.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target moe-generate
build/bin/moe-generate --max_tokens=48 "$@"
