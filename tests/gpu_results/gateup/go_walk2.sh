#!/bin/bash
# Stop 43, the walk (MOE_INT4_WALK=R, branch gateup) against the register kernel, trimmed
# to the device time left: parity with R = 4, matvec_bench R = 0 / 3, moe-bench 256 sequences
# R = 0 / 3 interleaved. Writes the summary as it goes.
set -u
tar xJf .device/gateup/bundle.txz -C /tmp
B=/tmp/bundle/bin
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for w in 0 3; do
    echo "=== MOE_INT4_WALK=$w round $r" >> $OUT/moe.txt
    MOE_INT4_WALK=$w timeout 60 $B/moe-bench --store_dir= --batches=256 --steps=16 --prompt= >> $OUT/moe.txt 2>&1
    grep -E "^256 +[0-9]" $OUT/moe.txt | tail -1 | sed "s/^/walk $w round $r: /" >> $S
  done
done
MOE_INT4_WALK=3 timeout 100 $B/parity_test \
  --gtest_filter='*QuantMatMulParity*:*QuantExpertFfnParity*:*ExpertFfn*' > $OUT/parity.txt 2>&1
echo "parity (walk 3) rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/parity.txt | head -20 >> $S
cat $S
