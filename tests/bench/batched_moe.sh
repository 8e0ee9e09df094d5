#!/usr/bin/env bash
# Batched MoE on the GPU machine, one call, from the repository root with bundle/ carried along:
#   tests/bench/batched_moe.sh OUT_DIR [quick]
# Parity of the expert kernels and the golden fixtures on CUDA (batch of 24 included), then
# moe-bench on the Qwen3-30B-A3B shape at batch 1, 8, 32, 64, 128, 256 and for 512- and
# 2048-token prompts against the byte and FLOP rooflines, with the --timings breakdown; then the
# planned path's two group sizes against each other (MOE_ROUTED_CHUNK=8: tensor-core matrix-vector
# groups; =128: tensor-core GEMM groups) at the batch sizes where the choice switches.
# "quick": the kernel parity cases only and no A/B. "profile": instead of the A/B, the GPU's own
# timeline (CUPTI, bundle/lib/libmoe_timeline.so: bundle moe_timeline) of decode steps at 64 and
# 256 sequences and of a 2048-token prefill, per kernel (timeline_report.py, appended to each
# run's log; the CSVs in OUT_DIR/timelines.tar.xz), and the batches without MatMul's K split
# (MOE_GEMM_SPLITK=0). Each step logs to
# OUT_DIR/<step>.txt; a summary is printed last.
set -uo pipefail
out=${1:?usage: tests/bench/batched_moe.sh OUT_DIR [quick]}
quick=${2:-}
mkdir -p "$out"
source tests/gpu_steps.sh  # bin, run, status
bench() {  # bench NAME TIMEOUT [moe-bench flags...]
  local name=$1 limit=$2
  shift 2
  run "$name" "$limit" "$bin/moe-bench" --model_dir=/tmp/moe_bench_model --store_dir= "$@"
}
if [[ $quick == quick || $quick == profile ]]; then
  run parity 200 "$bin/parity_test" --gtest_brief=1 --gtest_filter='*ExpertFfn*:*Gemm*:*MatMul*:*Route*'
else
  run parity 240 "$bin/parity_test" --gtest_brief=1
fi
run golden_gpu 150 "$bin/golden_gpu_test"
run golden_store_gpu 120 "$bin/golden_store_gpu_test"
bench moe_bench 300 --timings --batches=8,32,64,128,256 --prompt=512,2048 --steps=32
if [[ $quick == profile ]]; then
  tracer=$PWD/bundle/lib/libmoe_timeline.so
  traced() {  # NAME MARKER moe-bench flags...
    local name=$1 marker=$2
    shift 2
    LD_PRELOAD=$tracer MOE_TIMELINE_OUT=/tmp/$name.csv bench "$name" 200 --steps=2 "$@"
    { python3 tests/bench/timeline_report.py /tmp/$name.csv --marker "$marker" --skip 2 2>&1 ||
        { wc -l /tmp/$name.csv; head -3 /tmp/$name.csv; grep -c "$marker" /tmp/$name.csv; }
    } >>"$out/$name.txt"
  }
  traced timeline_b64 SampleKernel --batches=64 --batch_steps=8 --prompt=16
  traced timeline_b256 SampleKernel --batches=256 --batch_steps=8 --prompt=16
  traced timeline_prefill SampleKernel --batches= --prompt=2048,2048,2048,2048
  MOE_GEMM_SPLITK=0 bench no_splitk 200 --batches=32,64,128,256 --prompt=2048 --steps=8
  tar -C /tmp -cJf "$out/timelines.tar.xz" timeline_b64.csv timeline_b256.csv timeline_prefill.csv
elif [[ $quick != quick ]]; then
  for chunk in 8 128; do
    MOE_ROUTED_CHUNK=$chunk bench "chunk$chunk" 200 --batches=32,64,128,256 --prompt=2048 \
      --steps=4 --batch_steps=4
  done
fi
printf '%s\n' "${status[@]}" | tee "$out/summary.txt"
for f in "$out"/moe_bench.txt "$out"/chunk*.txt "$out"/no_splitk.txt; do
  [[ -f $f ]] && { echo "== $f"; grep -E '^[0-9]+ |time to first|fraction|decode tokens/s' "$f"; }
done
