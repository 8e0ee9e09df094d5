#!/usr/bin/env bash
# The HTTP API's cost, measured: the same streams through moe-frontend's gRPC API and through its
# HTTP API (/v1/completions, SSE), driven by one tool (moe-loadgen, --http for the second), at 1
# and 64 concurrent streams, on one worker with the built-in model. The two paths alternate, three
# rounds each, and the table prints the medians and HTTP / gRPC. JSON reports go to $OUT.
# Usage, from a bundle root (bin/ + lib/) or with BIN=build/bin:
#   tests/bench/http_vs_grpc.sh [cpu|cuda] [seconds per run]
set -euo pipefail
backend=${1:-cuda}
seconds=${2:-10}
bin=${BIN:-./bin}
out=${OUT:-./http_vs_grpc_out}
mkdir -p "$out"

"$bin/moe-worker" --backend="$backend" --model=models/default --listen=127.0.0.1:50061 \
  --metrics_listen=127.0.0.1:0 --max_running=128 --max_batch_tokens=4096 \
  >"$out/worker.log" 2>&1 &
worker=$!
"$bin/moe-frontend" --workers=127.0.0.1:50061 --listen=127.0.0.1:50051 \
  --http_listen=127.0.0.1:8080 --metrics_listen=127.0.0.1:0 --max_running=256 \
  >"$out/frontend.log" 2>&1 &
frontend=$!
trap 'kill -TERM $frontend $worker 2>/dev/null; wait' EXIT
for _ in $(seq 1 300); do
  "$bin/moe-client" --list_models 2>/dev/null | grep -q . && break
  sleep 0.2
done

# 128-token id prompts, 256 tokens each (ignore_eos), greedy: every call is the same work.
run() {  # run API CONCURRENCY ROUND
  local extra=()
  [ "$1" = http ] && extra=(--http=127.0.0.1:8080)
  "$bin/moe-loadgen" --model=default --concurrency="$2" --duration_seconds="$seconds" \
    --prompt_tokens=128 --max_tokens=256 "${extra[@]}" --json="$out/$1_$2_$3.json" \
    >"$out/$1_$2_$3.txt"
}
tps() { sed -n 's/.*"tokens_per_second": \([0-9.e+]*\).*/\1/p' "$1"; }
median() { sort -g | sed -n 2p; }  # of three

"$bin/moe-loadgen" --model=default --concurrency=8 --duration_seconds=3 --max_tokens=32 \
  >/dev/null  # warm-up
echo "backend $backend, $seconds s a run, three rounds alternating gRPC and HTTP"
printf '%8s %14s %14s %10s\n' streams grpc_tok/s http_tok/s http/grpc
for c in 1 64; do
  for r in 1 2 3; do run grpc $c $r; run http $c $r; done
  g=$(for r in 1 2 3; do tps "$out/grpc_${c}_$r.json"; done | median)
  h=$(for r in 1 2 3; do tps "$out/http_${c}_$r.json"; done | median)
  awk -v c="$c" -v g="$g" -v h="$h" 'BEGIN { printf "%8d %14.1f %14.1f %10.3f\n", c, g, h, h / g }'
done
