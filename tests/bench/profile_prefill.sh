#!/usr/bin/env bash
# Where a prefill's time goes, on the GPU machine with bundle/ carried along:
#   tests/bench/profile_prefill.sh OUT_DIR [prompt tokens, default 2048]
# 1. Every kernel of moe-bench's time-to-first-token run on 2 layers of the Qwen3-30B-A3B shape
#    (every expert resident, bf16 KV), with its device time (ncu serialises kernels), summed per
#    kernel name: the prompt's prefill dominates every kernel that is not sampling (the decode
#    runs before it are shortened to a 16-token context and one step);
# 2. ncu's speed-of-light, occupancy, warp-state, scheduler and memory sections on the prefill's
#    first three tensor-core GEMMs (q/k/v and o in bf16, the experts' gate in int4).
set -uo pipefail
out=${1:?usage: profile_prefill.sh OUT_DIR [prompt]}
prompt=${2:-2048}
mkdir -p "$out"
ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  "$PWD/bundle/bin/moe-bench" --layers=2 --model_dir=/tmp/profile_model --store_dir= \
  --batches= --context=16 --steps=1 --prompt="$prompt" >"$out/prefill.csv" 2>"$out/prefill.err"
python3 - "$out/prefill.csv" >"$out/prefill.txt" <<'PY'
import collections, csv, re, sys
total, count = collections.Counter(), collections.Counter()
for row in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')):
    if len(row) > 14 and row[12] == "gpu__time_duration.sum":
        name = re.sub(r"\(.*", "", row[4]).replace("void ", "").replace("(anonymous namespace)::", "")
        total[name] += float(row[14].replace(",", "")) / 1000
        count[name] += 1
print(f"{'us':>10} {'launches':>8}  kernel")
for name, us in total.most_common():
    print(f"{us:10.1f} {count[name]:8d}  {name[:110]}")
print(f"{sum(total.values()):10.1f} {sum(count.values()):8d}  total")
PY
cat "$out/prefill.txt"
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats
  --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis)
ncu --clock-control none "${sections[@]}" -k regex:'WgmmaGemm|PipelinedGemm' --launch-count 3 \
  "$PWD/bundle/bin/moe-bench" --layers=2 --model_dir=/tmp/profile_model --store_dir= \
  --batches= --context=16 --steps=1 --prompt="$prompt" >"$out/gemm_ncu.txt" 2>&1
