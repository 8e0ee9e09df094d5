#!/usr/bin/env bash
# The quantized-kernel runs on the GPU machine, in one call (tests/bench/NOTES.md): parity suite,
# matvec_bench, moe-bench --timings. Usage, from the folder that holds bundle/ (carried there):
#   bash run_device.sh OUT_DIR
# Each step's output goes to OUT_DIR/<step>.txt; a step that fails does not stop the next.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run_device.sh OUT_DIR}"
bin="$here/bundle/bin"
mkdir -p "$out"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } \
  | tee "$out/device.txt"
timeout 240 "$bin/parity_test" --gtest_brief=1 >"$out/parity.txt" 2>&1
echo "parity rc $?" | tee -a "$out/device.txt"
tail -4 "$out/parity.txt"
timeout 180 "$bin/matvec_bench" >"$out/matvec.txt" 2>&1
echo "matvec_bench rc $?" | tee -a "$out/device.txt"
cat "$out/matvec.txt"
if [[ -x "$bin/moe-bench" ]]; then
  timeout 300 "$bin/moe-bench" --timings --model_dir=/tmp/moe_bench_model >"$out/moe_bench.txt" 2>&1
  echo "moe-bench rc $?" | tee -a "$out/device.txt"
  cat "$out/moe_bench.txt"
fi
