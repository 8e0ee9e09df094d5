#!/usr/bin/env bash
# The test command: installs what is missing, builds everything (CUDA sources too when nvcc is
# present, warnings as errors), runs every test that needs no GPU, a one-minute fuzzing smoke,
# then the store's stress test again under ThreadSanitizer. Usage: tests/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
build_dir=${MOE_BUILD_DIR:-build}
jobs=$(nproc)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_WERROR=ON >/dev/null
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" -LE gpu --output-on-failure -j "$jobs" --timeout 900

# Soak, short: 64 streams with random cancels and deadlines for 80 s through moe-frontend and
# moe-worker; RSS flat after warm-up, no unexpected status, KV back to 0 (tests/soak/soak.py).
MOE_BUILD_DIR="$build_dir" MOE_TEST_MODEL="$build_dir/tests/integration/model" \
  /usr/bin/python3 tests/soak/soak.py --seconds=80 --sample=5 --warmup=30

# Fuzzing smoke: the libFuzzer targets (clang, ASan + UBSan) for 60 s in all (tests/fuzz/run.sh).
MOE_FUZZ_BUILD_DIR="$build_dir-fuzz" tests/fuzz/run.sh

# ThreadSanitizer: the multithreaded expert-store stress test (no CUDA needed for it).
tsan_dir="$build_dir-tsan"
cmake -S . -B "$tsan_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_WERROR=ON \
  -DMOE_SANITIZE=thread -DMOE_WITH_CUDA=OFF >/dev/null
cmake --build "$tsan_dir" -j "$jobs" --target store_stress_test
ctest --test-dir "$tsan_dir" -L stress --output-on-failure --timeout 900
