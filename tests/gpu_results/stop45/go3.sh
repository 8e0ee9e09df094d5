#!/bin/bash
# Stop 45, call 3: A's sums per 64 columns (this bundle) against 9d21816's libmoe_kernels.so in a
# copy of the same bundle: time to first token interleaved; the pipelined/wgmma GEMM parity cases;
# ncu instruction counts of the int4 walk kernels after 9d21816's code pairs and layout.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old; xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 80 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=64 --prompt=512,2048 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^64 +[0-9]|time to first token" $OUT/bench.txt | tail -3 | sed "s/^/$v $r: /" >> $S
  done
done
timeout 170 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*:*Routed*' \
  > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/parity.txt | head -20 >> $S
timeout 120 ncu --clock-control none -k regex:'Int4MmaWalk' --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section InstructionStats /tmp/bundle/bin/matvec_bench > $OUT/ncu_walk.txt 2>&1
echo "ncu rc $?" >> $S
grep -E "Int4MmaWalk|Duration|Executed Instructions  |Issued Warp|Warp Cycles Per Issued" $OUT/ncu_walk.txt >> $S
cat $S
