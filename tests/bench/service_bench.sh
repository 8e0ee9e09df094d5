#!/usr/bin/env bash
# The service's overhead, measured: the offline engine (moe-generate) against the same engine
# behind moe-frontend + moe-worker driven by moe-loadgen at 1, 8, 32 and 128 streams. Prints a
# table last; JSON reports go to $OUT (default ./service_bench_out).
# Usage, from a bundle root (bin/ + lib/) or the build dir's parent with BIN=build/bin:
#   tests/bench/service_bench.sh [cpu|cuda] [seconds per concurrency]
set -euo pipefail
backend=${1:-cuda}
seconds=${2:-20}
bin=${BIN:-./bin}
out=${OUT:-./service_bench_out}
mkdir -p "$out"
prompt_tokens=128
max_tokens=256

# The built-in default model (written by moe-generate on first use). The offline rate is the
# median of 7 warm runs: one 256-token run is ~0.1 s and moved 0.26-0.32 ms a token run to run
# (H200, tests/bench/NOTES.md), more than the overhead to be measured.
prompt=$(printf 'the %.0s' $(seq 1 $prompt_tokens))
: >"$out/offline.txt"
for run in $(seq 0 7); do  # run 0 warms up and writes the model
  "$bin/moe-generate" --backend="$backend" --prompt="$prompt" --max_tokens=$max_tokens \
    --ignore_eos --temperature=0 2>"$out/offline_run.txt" >/dev/null
  [ "$run" -gt 0 ] && sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' "$out/offline_run.txt" \
    >>"$out/offline.txt"
done
offline_tps=$(sort -g "$out/offline.txt" | sed -n 4p)

"$bin/moe-worker" --backend="$backend" --model=models/default --listen=127.0.0.1:50061 \
  --metrics_listen=127.0.0.1:0 --max_running=128 --max_batch_tokens=4096 --kv_budget=8GiB \
  >"$out/worker.log" 2>&1 &
worker=$!
"$bin/moe-frontend" --workers=127.0.0.1:50061 --listen=127.0.0.1:50051 \
  --metrics_listen=127.0.0.1:0 --max_running=256 >"$out/frontend.log" 2>&1 &
frontend=$!
trap 'kill -TERM $frontend $worker 2>/dev/null; wait' EXIT
for _ in $(seq 1 300); do
  "$bin/moe-client" --list_models 2>/dev/null | grep -q . && break
  sleep 0.2
done

for c in 1 8 32 128; do
  "$bin/moe-loadgen" --model=default --concurrency=$c --duration_seconds="$seconds" \
    --prompt_tokens=$prompt_tokens --max_tokens=$max_tokens --json="$out/streams_$c.json" \
    >"$out/streams_$c.txt"
done

echo "backend $backend; offline decode $offline_tps tok/s (moe-generate, 1 sequence, median of 7:" \
  "$(sort -g "$out/offline.txt" | tr '\n' ' '))"
printf '%8s %12s %10s %10s %10s %10s %8s\n' streams tokens/s ttft_p50 ttft_p99 itl_p50 itl_p99 errors
for c in 1 8 32 128; do
  python3 - "$out/streams_$c.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ms = lambda s: f"{s * 1e3:.2f}ms"
print(f"{r['concurrency']:8d} {r['tokens_per_second']:12.1f} {ms(r['ttft_seconds']['p50']):>10} "
      f"{ms(r['ttft_seconds']['p99']):>10} {ms(r['itl_seconds']['p50']):>10} "
      f"{ms(r['itl_seconds']['p99']):>10} {sum(r['errors'].values()):8d}")
PY
done
python3 - "$out/streams_1.json" "$offline_tps" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
offline_ms = 1e3 / float(sys.argv[2])
itl_ms = r['itl_seconds']['p50'] * 1e3
print(f"per-token time at 1 stream: service {itl_ms:.3f} ms (ITL p50) vs offline {offline_ms:.3f} ms "
      f"-> service adds {100 * (itl_ms / offline_ms - 1):+.1f}%")
PY
