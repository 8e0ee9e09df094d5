#!/usr/bin/env bash
# The GPU machine's suite, one call, from the repository root with bundle/ carried along:
#   tests/gpu_suite.sh OUT_DIR
# GPU tests (parity vs the CPU reference, golden fixtures on CUDA), the end-to-end generator on
# CUDA, then the benchmarks (store tiers, kernels, the Qwen3-30B-A3B-shaped model, the service
# against the offline engine). Each step logs to OUT_DIR/<step>.txt; a failing step does not stop
# the next; a summary is printed last and kept in OUT_DIR/summary.txt.
set -uo pipefail
out=${1:?usage: tests/gpu_suite.sh OUT_DIR}
mkdir -p "$out"
source tests/gpu_steps.sh  # bin, run, status
run parity 240 "$bin/parity_test" --gtest_brief=1
run golden_gpu 120 "$bin/golden_gpu_test"
run golden_store_gpu 120 "$bin/golden_store_gpu_test"
run generate_cuda 120 "$bin/moe-generate" --backend=cuda --max_tokens=64 --seed=1 \
  --temperature=0 --ignore_eos --timings
run store_bench 180 "$bin/moe-store-bench" --backend=cuda --dir=/tmp/moe_store_bench \
  --experts=512 --device_slots=128 --io_threads=8,16
run matvec_bench 180 "$bin/matvec_bench"
run moe_bench 500 "$bin/moe-bench" --timings --model_dir=/tmp/moe_bench_model \
  --kv_formats=bf16,fp8_e4m3,tq4,tq3.5,tq3,tq2.5,tq2
# Issue 5's 32k comparison, robust to a slow spell: five interleaved rounds, median reported.
run kv_32k_rounds 300 "$bin/moe-bench" --kv_only --model_dir=/tmp/moe_bench_model \
  --kv_formats=bf16,fp8_e4m3,tq4,tq3.5,tq3,tq2.5,tq2 --kv_contexts=32768 --kv_batches=1 \
  --kv_steps=8 --kv_repeats=5
# CUDA graphs on and off: batch 1 and 8 sequences on the model above, then the built-in model.
run graphs_ab 300 tests/bench/graphs_ab.sh "$out/graphs_ab" 3 /tmp/moe_bench_model --batches=8 \
  --prompt=16 --steps=64
OUT=$out/service BIN=$bin run service_bench 300 tests/bench/service_bench.sh cuda 10
printf '%s\n' "${status[@]}" | tee "$out/summary.txt"
