#!/bin/bash
# Routing traces recorded from the engine, replayed by moe-store-sim (every policy against MIN):
# the built-in model imported as a store, then
#   batch 1:  moe-generate, one sequence, sampled, --prefetch (the predictions ride in the trace)
#   batch 16: moe-worker behind moe-frontend, 16 concurrent streams from moe-loadgen
# Usage: tests/bench/record_traces.sh [OUT]   (env BIN: the binaries, default build-cpu/bin;
# MODEL: a model directory, default the built-in one the tests write)
set -euo pipefail
out=${1:-/tmp/moe_traces}
bin=${BIN:-build-cpu/bin}
model=${MODEL:-build-cpu/tests/integration/model}
mkdir -p "$out"
rm -rf "$out/store"
"$bin/moe-import" --model_dir="$model" --store_dir="$out/store" --format=bf16 >"$out/import.log" 2>&1
budget=1MiB  # a small device tier: the trace, not the budget, is what the simulator replays

"$bin/moe-generate" --model="$out/store" --device_budget=$budget --prefetch \
  --record_trace="$out/batch1.trace" --temperature=0.8 --seed=7 --ignore_eos --max_tokens=1000 \
  --user="Tell me a long story about a lighthouse keeper." >/dev/null 2>"$out/batch1.log"

"$bin/moe-worker" --model="$out/store" --device_budget=$budget --prefetch \
  --record_trace="$out/batch16.trace" --listen=127.0.0.1:50071 --metrics_listen=127.0.0.1:0 \
  --max_running=16 >"$out/worker.log" 2>&1 &
worker=$!
"$bin/moe-frontend" --workers=127.0.0.1:50071 --listen=127.0.0.1:50072 \
  --metrics_listen=127.0.0.1:0 >"$out/frontend.log" 2>&1 &
frontend=$!
trap 'kill -TERM $frontend $worker 2>/dev/null; wait' EXIT
for _ in $(seq 1 300); do
  "$bin/moe-client" --target=127.0.0.1:50072 --list_models 2>/dev/null | grep -q . && break
  sleep 0.2
done
name=$("$bin/moe-client" --target=127.0.0.1:50072 --list_models | head -1 | awk '{print $1}')
"$bin/moe-loadgen" --target=127.0.0.1:50072 --model="$name" --concurrency=16 \
  --duration_seconds=20 --prompt_tokens=64 --max_tokens=128 >"$out/loadgen.txt"
kill -TERM $frontend $worker
wait $frontend $worker || true
trap - EXIT

for t in batch1 batch16; do
  echo "== $t"
  "$bin/moe-store-sim" --trace="$out/$t.trace" --budgets=5,10,25,50
done
