#!/usr/bin/env bash
# CUDA graphs on and off (MOE_CUDA_GRAPHS), same binaries, same run, on the GPU machine. From the
# repository root with bundle/ carried along:
#   tests/bench/graphs_ab.sh OUT_DIR ROUNDS MODEL_DIR [moe-bench flags...]
# Generates the synthetic model in MODEL_DIR unless it is there, then ROUNDS interleaved moe-bench
# runs (off, on, off, ...) with the flags given, and prints each run's decode and throughput
# lines and its step-graph counters; then ROUNDS interleaved moe-generate runs on the built-in
# model (4 layers: a step the host's launches bound), 256 greedy tokens after a 128-token prompt.
set -uo pipefail
out=${1:?usage: graphs_ab.sh OUT_DIR ROUNDS MODEL_DIR [moe-bench flags...]}
rounds=${2:?rounds}
model=${3:?model dir}
shift 3
mkdir -p "$out"
bin=$PWD/bundle/bin
if [[ ! -f $model/config.json ]]; then
  "$bin/moe-bench" --model_dir="$model" --batches= --steps=2 --prompt=16 --store_dir= \
    >"$out/generate.txt" 2>&1 || { tail "$out/generate.txt"; exit 1; }
fi
for r in $(seq "$rounds"); do
  for g in 0 1; do
    MOE_CUDA_GRAPHS=$g "$bin/moe-bench" --model_dir="$model" --store_dir= "$@" \
      >"$out/bench_graphs${g}_$r.txt" 2>&1
    grep -E 'decode tokens/s|throughput tokens/s|time to first|step graphs|^(bf16|fp8|tq)' \
      "$out/bench_graphs${g}_$r.txt" | sed "s/^/graphs=$g round $r: /"
  done
done
prompt=$(printf 'the %.0s' $(seq 1 128))
"$bin/moe-generate" --backend=cuda --prompt=the --max_tokens=4 >/dev/null 2>&1  # writes the model
for r in $(seq "$rounds"); do
  for g in 0 1; do
    MOE_CUDA_GRAPHS=$g "$bin/moe-generate" --backend=cuda --prompt="$prompt" --max_tokens=256 \
      --ignore_eos --temperature=0 2>"$out/generate_graphs${g}_$r.txt" >/dev/null
    grep -oE 'decode [0-9.]+ tok/s' "$out/generate_graphs${g}_$r.txt" |
      sed "s/^/graphs=$g round $r: built-in model, /"
  done
done
