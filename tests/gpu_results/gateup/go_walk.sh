#!/bin/bash
# Not run as written (stop 43 ran the trimmed go_walk2.sh): the walk (MOE_INT4_WALK=R) against the
# register kernel. Parity with R = 4 (6 and 16 row-blocks: full and partial walks), then
# matvec_bench and moe-bench interleaved. Bundle: MOE_BUNDLE_TARGETS="moe-bench parity_test
# matvec_bench" deploy/make_bundle.sh, carried as .device/gateup/bundle.txz. ~5 minutes.
set -u
T0=$SECONDS
tar xJf .device/gateup/bundle.txz -C /tmp
B=/tmp/bundle/bin
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
MOE_INT4_WALK=4 timeout 170 $B/parity_test \
  --gtest_filter='*QuantMatMulParity*:*QuantExpertFfnParity*:*ExpertFfn*' > $OUT/parity.txt 2>&1
echo "parity (walk 4) rc $? ($((SECONDS - T0)) s)" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/parity.txt | head -20 >> $S
: > $OUT/matvec.txt
for w in 0 2 3 6; do
  echo "=== MOE_INT4_WALK=$w" >> $OUT/matvec.txt
  MOE_INT4_WALK=$w timeout 60 $B/matvec_bench >> $OUT/matvec.txt 2>&1
done
grep -E "^=== |ExpertFfn T 256" $OUT/matvec.txt >> $S
: > $OUT/moe.txt
for r in 1 2; do
  for w in 0 3; do
    echo "=== MOE_INT4_WALK=$w round $r" >> $OUT/moe.txt
    MOE_INT4_WALK=$w timeout 75 $B/moe-bench --store_dir= --batches=64,256 --steps=16 --prompt= \
      --timings >> $OUT/moe.txt 2>&1
  done
done
grep -E "^=== |^(64|256) +[0-9]" $OUT/moe.txt >> $S
cat $S
