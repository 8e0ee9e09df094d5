#!/usr/bin/env bash
# The GPU machine's suite, run from the repository root with bundle/ carried along:
#   tests/gpu_suite.sh [OUT_DIR]      (OUT_DIR defaults to ./gpu-out)
# GPU tests (parity vs the CPU reference, golden fixtures on CUDA), then the end-to-end generator
# on CUDA and the benchmarks; every log lands in OUT_DIR; a summary table is printed last.
set -uo pipefail
out=${1:-gpu-out}
mkdir -p "$out"
bin=bundle/bin
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=()
run() {  # run NAME CMD...: log to $out/NAME.txt, remember pass/fail
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  status+=("$(printf '%-22s rc=%-3d %4ds' "$name" "$rc" $((SECONDS - t0)))")
}
run parity "$bin/parity_test" --gtest_brief=1
run golden_gpu "$bin/golden_gpu_test"
run generate_cuda "$bin/moe-generate" --backend=cuda --max_tokens=64 \
  --seed=1 --temperature=0 --ignore_eos --timings
[[ -x "$bin/moe-store-bench" ]] && run store_bench "$bin/moe-store-bench" --backend=cuda \
  --dir=/tmp/moe_store_bench --experts=128 --device_slots=32 --io_threads=8,16
[[ -x "$bin/matvec_bench" ]] && run matvec_bench "$bin/matvec_bench"
[[ -x "$bin/moe-bench" ]] && run moe_bench "$bin/moe-bench" --timings
printf '%s\n' "${status[@]}" | tee "$out/summary.txt"
grep -h -E "max relative logit error|greedy tokens|\[generate\]|GB/s|tok/s" "$out"/golden_gpu.txt \
  "$out"/generate_cuda.txt "$out"/store_bench.txt 2>/dev/null | tail -40
