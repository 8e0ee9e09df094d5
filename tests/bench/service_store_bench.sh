#!/usr/bin/env bash
# Issue 27's "through the service": moe-loadgen at 1, 16, 64 and 128 streams against moe-worker
# serving a synthetic Qwen3-30B-A3B-shaped model store (moe-bench --serve_dir: random weights,
# int4 g64 experts, 16.3 GB) behind moe-frontend, with the worker's defaults (auto budgets, as
# printed in its log; --max_running and --max_batch_tokens of a GPU), next to moe-bench's offline
# decode figure for the same shape and batch sizes.
# Streams: 128 random prompt ids, 256 new tokens (ignore_eos), so a stream's context runs from 128
# to 384, 256 on average: moe-bench runs at --context=256 (random KV, one token a step each).
# Sampled at temperature 1 (TEMPERATURE): moe-bench feeds random tokens; greedy decoding of random
# weights repeats a few tokens, and the streams' steps then route to ~8 experts a layer (measured:
# the experts/layer column, from the worker's store lookups), far less expert work than moe-bench's.
# Inversion: a larger batch whose inter-token p50 (the service's step time) is below a smaller
# one's. Prints a table last; logs, metrics and JSON go to $OUT (default ./service_store_bench_out).
# Usage, from a bundle root (bin/ + lib/) or with BIN=build/bin:
#   tests/bench/service_store_bench.sh [seconds per concurrency] [moe-bench --shape]
# A dry run of the script on the CPU, on a slice of the shape:
#   BACKEND=cpu BENCH_FLAGS="--layers=2 --experts=8 --vocab=2048" tests/bench/service_store_bench.sh 3
set -euo pipefail
seconds=${1:-20}
shape=${2:-qwen3-30b-a3b}
bin=${BIN:-./bin}
out=${OUT:-./service_store_bench_out}
store=${STORE:-/tmp/moe_serve_store}
backend=${BACKEND:-cuda}
read -r -a bench_flags <<<"${BENCH_FLAGS:-}"  # more moe-bench flags, the same for both runs
mkdir -p "$out"
streams=(1 16 64 128)
prompt_tokens=${PROMPT_TOKENS:-128}
max_tokens=${MAX_TOKENS:-256}
temperature=${TEMPERATURE:-1}
context=$((prompt_tokens + max_tokens / 2))
model="moe-bench-$shape"  # the store's model id (moe-bench --serve_dir)
metrics=127.0.0.1:9461

# Offline first, while the GPU is the benchmark's alone. --prompt= and --store_dir=: no prefill
# and no offload runs; 16 timed steps per batch.
batches=$(IFS=,; echo "${streams[*]}")
timeout 200 "$bin/moe-bench" --backend="$backend" --shape="$shape" "${bench_flags[@]}" \
  --context=$context --batches="$batches" --batch_steps=16 --prompt= --store_dir= \
  --model_dir=/tmp/moe_bench_model >"$out/moe_bench.txt" 2>&1
rm -rf /tmp/moe_bench_model
awk '/^decode steps of B sequences/ {f = 1; next} f && $1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $2, $3}' \
  "$out/moe_bench.txt" >"$out/moe_bench_batches.txt"

timeout 200 "$bin/moe-bench" --shape="$shape" "${bench_flags[@]}" --serve_dir="$store" \
  >"$out/serve_dir.txt" 2>&1
cat "$out/serve_dir.txt"

"$bin/moe-worker" --backend="$backend" --model="$store" --listen=127.0.0.1:50061 \
  --metrics_listen=$metrics >"$out/worker.log" 2>&1 &
worker=$!
"$bin/moe-frontend" --workers=127.0.0.1:50061 --listen=127.0.0.1:50051 \
  --metrics_listen=127.0.0.1:0 >"$out/frontend.log" 2>&1 &
frontend=$!
trap 'kill -TERM $frontend $worker 2>/dev/null; wait' EXIT
for _ in $(seq 1 600); do
  timeout 5 "$bin/moe-client" --list_models 2>/dev/null | grep -q "$model" && break
  kill -0 $worker 2>/dev/null || { cat "$out/worker.log"; exit 1; }
  sleep 0.2
done
grep -h "budgets" "$out/worker.log" || { cat "$out/worker.log"; exit 1; }

scrape() {  # the worker's /metrics, to a file
  python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics').read().decode())" >"$1"
}
loadgen() {  # concurrency, seconds, name
  timeout $(($2 + 120)) "$bin/moe-loadgen" --model="$model" --concurrency="$1" \
    --duration_seconds="$2" --prompt_tokens=$prompt_tokens --max_tokens=$max_tokens \
    --temperature="$temperature" \
    --json="$out/$3.json" >"$out/$3.txt"
}
# Warm-up: every expert read once from the blob files into the VRAM tier (the auto device budget
# holds them all on an 80 GB card), off the clock.
loadgen 128 15 warmup
for c in "${streams[@]}"; do
  scrape "$out/metrics_before_$c.txt"
  loadgen "$c" "$seconds" "streams_$c"
  scrape "$out/metrics_after_$c.txt"
done

echo "shape $shape; prompt $prompt_tokens tokens, $max_tokens new, temperature $temperature;" \
  "moe-bench at context $context;" \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
python3 - "$out" "$store" "${streams[@]}" <<'PY'
import json, sys
out, store, streams = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3:]]
layers = json.load(open(f"{store}/config.json"))["num_hidden_layers"]
bench = {}
for line in open(f"{out}/moe_bench_batches.txt"):
    b, tps, step_ms = line.split()
    bench[int(b)] = (float(tps), float(step_ms))

def metric(path, name):  # sum over label sets
    total = 0.0
    for line in open(path):
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total

print(f"{'streams':>7} {'svc tok/s':>10} {'bench tok/s':>11} {'ratio':>6} {'bench step':>10} "
      f"{'itl p50':>8} {'itl p99':>8} {'ttft p50':>9} {'tok/step':>8} {'experts/layer':>13} "
      f"{'disk rd':>7} {'err':>4}  flags")
prev = None
for c in streams:
    r = json.load(open(f"{out}/streams_{c}.json"))
    d = {n: metric(f"{out}/metrics_after_{c}.txt", n) - metric(f"{out}/metrics_before_{c}.txt", n)
         for n in ("moe_generation_tokens_total", "moe_engine_steps_total",
                   "moe_store_blob_reads_total", "moe_store_lookups_total")}
    tps, step_ms = bench.get(c, (float("nan"), float("nan")))
    ratio = r["tokens_per_second"] / tps
    itl = r["itl_seconds"]["p50"] * 1e3
    flags = []
    if abs(ratio - 1) > 0.15:
        flags.append("off by >15%")
    if prev is not None and itl < prev:
        flags.append(f"INVERSION (itl p50 below {prev:.2f} ms at fewer streams)")
    prev = itl
    steps = max(1, d["moe_engine_steps_total"])
    per_step = d["moe_generation_tokens_total"] / steps
    union = d["moe_store_lookups_total"] / steps / layers  # distinct experts a layer, a step
    print(f"{c:>7} {r['tokens_per_second']:>10.1f} {tps:>11.1f} {ratio:>6.2f} {step_ms:>8.2f}ms "
          f"{itl:>6.2f}ms {r['itl_seconds']['p99'] * 1e3:>6.2f}ms "
          f"{r['ttft_seconds']['p50'] * 1e3:>7.1f}ms {per_step:>8.1f} {union:>13.1f} "
          f"{d['moe_store_blob_reads_total']:>7.0f} {sum(r['errors'].values()):>4}  "
          f"{'; '.join(flags)}")
PY
