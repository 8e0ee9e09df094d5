#!/bin/bash
# Stop 45, call 1: main's kernels as they are (3b1c0f6). moe-bench --timings at 1/64/256
# sequences and a 2,048-token prompt; matvec_bench; ncu (stall reasons, source counters) on the
# int4 walk kernel of matvec_bench's 256-token row; the SASS of that kernel and of the int4 wgmma
# GEMM (for instruction counts a loop).
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
B=/tmp/bundle/bin; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 150 $B/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= --timings \
  --batches=64,256 --prompt=2048 > $OUT/bench_timings.txt 2>&1
echo "bench rc $?" >> $S
timeout 100 $B/matvec_bench > $OUT/matvec.txt 2>&1; echo "matvec rc $?" >> $S
timeout 200 ncu --clock-control none -k regex:'Int4MmaWalk' --launch-count 2 --import-source no \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
  --section InstructionStats -o /tmp/walk $B/matvec_bench > $OUT/ncu_run.txt 2>&1
echo "ncu rc $?" >> $S
ncu -i /tmp/walk.ncu-rep > $OUT/ncu_walk.txt 2>&1
ncu -i /tmp/walk.ncu-rep --page source --print-source sass --csv > /tmp/walk_sass.csv 2>&1
echo "source page rc $? lines $(wc -l < /tmp/walk_sass.csv)" >> $S
head -c 3000000 /tmp/walk_sass.csv | xz -6 > $OUT/walk_sass.csv.xz
cuobjdump -sass /tmp/bundle/lib/libmoe_kernels.so > /tmp/all.sass 2>&1
echo "cuobjdump rc $? lines $(wc -l < /tmp/all.sass)" >> $S
awk '/Function : .*(Int4MmaWalk|WgmmaGemmKernel)/{p=1} /Function : /{if ($0 !~ /(Int4MmaWalk|WgmmaGemmKernel)/) p=0} p' \
  /tmp/all.sass | xz -6 > $OUT/kernels_sass.xz
cat $S
