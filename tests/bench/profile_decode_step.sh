#!/usr/bin/env bash
# Where a decode step's time goes, on the GPU machine with bundle/ carried along:
#   tests/bench/profile_decode_step.sh OUT_DIR [sequences, default 1]
# 1. every kernel of one decode step of that many sequences at context 512 (2 layers of the
#    Qwen3-30B-A3B shape, every expert resident, bf16 KV) with its device time, in launch order
#    (ncu serialises kernels: the sum is the step without launch overlap);
# 2. ncu's launch, occupancy, speed-of-light, memory and warp-state sections on the int4
#    matrix-vector kernels of matvec_bench (the lm head, and the SwiGLU and down forms one
#    token's 8 experts run).
set -uo pipefail
out=${1:?usage: profile_decode_step.sh OUT_DIR [sequences]}
batch=${2:-1}
mkdir -p "$out"
bin=$PWD/bundle/bin
ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  "$bin/moe-bench" --kv_only --layers=2 --model_dir=/tmp/profile_model --kv_contexts=512 \
  --kv_batches="$batch" --kv_steps=1 --kv_formats=bf16 >"$out/step.csv" 2>"$out/step.err"
python3 - "$out/step.csv" >"$out/step.txt" <<'PY'
import csv, re, sys
rows = []
for row in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')):
    if len(row) > 14 and row[12] == "gpu__time_duration.sum":
        name = re.sub(r"\(.*", "", row[4]).replace("void ", "").replace("(anonymous namespace)::", "")
        rows.append((name, float(row[14].replace(",", "")) / 1000))
# The last decode step: kernels after the last sampling kernel but one.
marks = [i for i, (n, _) in enumerate(rows) if "Sample" in n]
first = marks[-2] + 1 if len(marks) > 1 else 0
total = 0.0
for name, us in rows[first:marks[-1] + 1 if marks else len(rows)]:
    total += us
    print(f"{us:8.2f}  {name[:110]}")
print(f"{total:8.2f}  total (device time of the step's kernels, serialised)")
PY
# MOE_PROFILE_STEP_ONLY=1: the step's kernel list only.
[[ -n ${MOE_PROFILE_STEP_ONLY:-} ]] && { cat "$out/step.txt"; exit 0; }
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats
  --section SourceCounters)
ncu --clock-control none "${sections[@]}" --kernel-name-base demangled \
  -k regex:'MmaMatVec(Sliced)?Kernel<.*Int4Mma' --launch-skip 0 --launch-count 1 \
  "$bin/matvec_bench" >"$out/lm_head_int4.txt" 2>&1
ncu --clock-control none "${sections[@]}" --kernel-name-base demangled \
  -k regex:'MmaMatVec(Sliced)?Kernel<.*Int4Mma, .bool.1' --launch-skip 2 --launch-count 1 \
  "$bin/matvec_bench" >"$out/glu_int4.txt" 2>&1
ncu --clock-control none "${sections[@]}" --kernel-name-base demangled \
  -k regex:'MmaMatVec(Sliced)?Kernel<.*Int4Mma, .bool.0' --launch-skip 108 --launch-count 1 \
  "$bin/matvec_bench" >"$out/down_int4.txt" 2>&1
ls -la "$out"
