#!/bin/sh
# The CLIs end to end: moe-import the default model, moe-generate on the store with a small
# device budget, --prefetch and --record_trace, then moe-store-sim --trace replays the trace.
# Usage: trace_replay_test.sh BIN_DIR DEFAULT_MODEL_DIR
set -eu
bin=$1
model=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin/moe-import" --model_dir="$model" --store_dir="$work/store" --format=bf16 >"$work/import.log" 2>&1
"$bin/moe-generate" --model="$work/store" --device_budget=5MiB --prefetch \
  --record_trace="$work/trace.txt" --temperature=0 --ignore_eos --max_tokens=16 --timings \
  >"$work/gen.out" 2>"$work/gen.err"
cat "$work/gen.err"
head -3 "$work/trace.txt"
# The [store] line: prefetch issued N used M with 0 < M <= N.
line=$(grep '^\[store\]' "$work/gen.err")
issued=$(echo "$line" | sed -n 's/.*prefetch issued \([0-9]*\) used.*/\1/p')
used=$(echo "$line" | sed -n 's/.*prefetch issued [0-9]* used \([0-9]*\) .*/\1/p')
[ "$issued" -gt 0 ] && [ "$used" -gt 0 ] && [ "$used" -le "$issued" ] || {
  echo "FAIL: prefetch issued '$issued' used '$used'"; exit 1; }
grep -q '^\[timings\] prefetch' "$work/gen.err" || { echo "FAIL: no prefetch timing"; exit 1; }

"$bin/moe-store-sim" --trace="$work/trace.txt" >"$work/sim.out"
cat "$work/sim.out"
# Accesses the simulator replayed == expert ids the trace lists; the predictions (lines "p ...",
# one per prefetch) came along.
listed=$(grep -v '^#' "$work/trace.txt" | tail -n +2 | grep -v '^p ' |
  awk '{ n += NF - 2 } END { print n }')
predicted=$(grep -c '^p ' "$work/trace.txt")
grep -q "experts, $listed accesses, $predicted predictions" "$work/sim.out" || {
  echo "FAIL: moe-store-sim did not replay $listed accesses and $predicted predictions"; exit 1; }
[ "$predicted" -gt 0 ] || { echo "FAIL: no predictions recorded"; exit 1; }
grep -q "^moe-routing-trace 2 " "$work/trace.txt"
echo "PASS: $listed accesses and $predicted predictions replayed; prefetch used $used of $issued issued"
