#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA sources too when nvcc is
# present, warnings as errors) and runs every test that needs no GPU. Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
build_dir=${MOE_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_WERROR=ON >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" -LE gpu --output-on-failure -j "$(nproc)" --timeout 600
