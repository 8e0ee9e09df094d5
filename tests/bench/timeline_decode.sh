#!/usr/bin/env bash
# Where decode steps spend the GPU's time, launches overlapped as in production (CUPTI timeline,
# kernel_timeline.cc), on the GPU machine with bundle/ carried along:
#   tests/bench/timeline_decode.sh OUT_DIR [FORMAT...]
# Qwen3-30B-A3B-shaped model, every expert resident: batch 1 at context 512 (with and without
# the tracer, to show what tracing costs), 8 sequences, then batch 1 at 32k for each KV FORMAT
# (default bf16 tq3.5). Each run's report (timeline_report.py) goes to OUT_DIR/NAME.txt, the raw
# timelines to OUT_DIR/timelines.tar.xz.
set -uo pipefail
out=${1:?usage: timeline_decode.sh OUT_DIR [FORMAT...]}
shift
formats=("$@")
[[ ${#formats[@]} -gt 0 ]] || formats=(bf16 tq3.5)
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$PWD/bundle/bin
tracer=$PWD/bundle/lib/libmoe_timeline.so
report=$PWD/tests/bench/timeline_report.py
work=/tmp/timeline
mkdir -p "$work"
model=$work/model
common=(--model_dir="$model" --store_dir= --prompt=16)

traced() {  # NAME moe-bench flags...
  local name=$1
  shift
  LD_PRELOAD=$tracer MOE_TIMELINE_OUT=$work/$name.csv "$bin/moe-bench" "${common[@]}" "$@" \
    >"$work/$name.log" 2>&1 || { tail "$work/$name.log"; return 1; }
  { grep -E 'decode tokens/s|throughput tokens/s|^(bf16|fp8|tq)' "$work/$name.log"
    python3 "$report" "$work/$name.csv"; } >"$out/$name.txt"
  echo "== $name"
  head -25 "$out/$name.txt"
}

"$bin/moe-bench" "${common[@]}" --batches= --steps=8 >"$work/generate.log" 2>&1 ||
  { tail "$work/generate.log"; exit 1; }
"$bin/moe-bench" "${common[@]}" --batches= --steps=64 >"$work/untraced.log" 2>&1
echo "== batch 1, untraced: $(grep -E 'decode tokens/s' "$work/untraced.log")"
traced batch1 --batches= --steps=64
traced batch8 --batches=8 --batch_steps=32 --steps=8
for f in "${formats[@]}"; do
  traced "ctx32k_$f" --kv_only --kv_formats="$f" --kv_contexts=32768 --kv_batches=1 --kv_steps=24
done
tar -C "$work" -cJf "$out/timelines.tar.xz" $(cd "$work" && ls ./*.csv)
