#!/bin/bash
# Stop 47, call 1: main's kernels (418c46a's device code). ncu with stall reasons and source
# counters on the small decode projections: the bf16 tensor-core matrix-vector kernels and the
# int4 expert kernels of an 8-sequence step, the wgmma GEMMs of a 64-sequence step (2 layers,
# context 512), so that their fixed cost can be read per instruction.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
B=/tmp/bundle/bin; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
sec=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
  --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters
  --section InstructionStats)
# the generator writes the model once (profile_decode_step.sh's path)
run() {  # name batch kernel-regex count
  timeout 200 ncu --clock-control none -k regex:"$3" --launch-skip 0 --launch-count $4 \
    --import-source no "${sec[@]}" -o /tmp/$1 $B/moe-bench --kv_only --layers=2 \
    --model_dir=/tmp/profile_model --kv_contexts=512 --kv_batches=$2 --kv_steps=1 \
    --kv_formats=bf16 > $OUT/$1_run.txt 2>&1
  echo "$1 ncu rc $?" >> $S
  ncu -i /tmp/$1.ncu-rep > $OUT/$1.txt 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --print-source sass --csv > /tmp/$1_sass.csv 2>&1
  python3 tests/bench/ncu_sass_summary.py /tmp/$1_sass.csv --top 25 > $OUT/$1_sass_summary.txt 2>&1
  echo "$1 summary rc $?" >> $S
}
run mv8 8 'MmaMatVecKernel' 6
run gemm64 64 'WgmmaGemmKernel' 6
cat $S
grep -E "MmaMatVecKernel|WgmmaGemm|Duration|Grid Size|Registers Per|Eligible Warps|Issued Warp|Memory Throughput|DRAM Through" $OUT/mv8.txt $OUT/gemm64.txt | head -120
