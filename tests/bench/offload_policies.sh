#!/usr/bin/env bash
# The GPU machine, one call (bundle/ carried): parity and golden tests, then moe-bench's offload
# runs on the Qwen3-30B-A3B shape at 5, 10 and 25% of the experts in VRAM (the rest in the pinned
# host tier), the old default policy (lru) and next_use side by side.
#   tests/bench/offload_policies.sh OUT_DIR
set -uo pipefail
out=${1:?usage: tests/bench/offload_policies.sh OUT_DIR}
mkdir -p "$out"
source tests/gpu_steps.sh  # bin, run, status
run parity 240 "$bin/parity_test" --gtest_brief=1
run golden_gpu 120 "$bin/golden_gpu_test"
run golden_store_gpu 120 "$bin/golden_store_gpu_test"
run offload 420 "$bin/moe-bench" --model_dir=/tmp/moe_bench_model --batches=8 --prompt=512 \
  --store_vram_percents=5,10,25 --store_policies=lru,next_use --store_steps=32
printf '%s\n' "${status[@]}" | tee "$out/summary.txt"
