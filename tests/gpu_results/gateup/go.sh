#!/bin/bash
# gateup: the int4 two-n-tile kernel through a cp.async ring (MOE_INT4_RING unset: ring for gate/up
# and down; =glu: gate/up only; =0: the register kernel). Parity, matvec_bench, moe-bench A/B.
set -u
T0=$SECONDS
tar xJf .device/gateup/bundle.txz -C /tmp
B=/tmp/bundle/bin
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $S
echo "== parity (ring default)" >> $S
timeout 170 $B/parity_test --gtest_filter='*QuantMatMulParity*:*QuantExpertFfnParity*:*ExpertFfn*' > $OUT/parity.txt 2>&1
echo "parity rc $? ($((SECONDS - T0)) s)" >> $S
grep -E "^\[  (PASSED|FAILED) |tests ran|FAILED  \]" $OUT/parity.txt | head -20 >> $S
: > $OUT/matvec.txt
for mode in 0 ring glu; do
  echo "=== MOE_INT4_RING=$mode" >> $OUT/matvec.txt
  MOE_INT4_RING=$mode timeout 60 $B/matvec_bench >> $OUT/matvec.txt 2>&1
  echo "matvec $mode rc $? ($((SECONDS - T0)) s)" >> $S
done
echo "== matvec ExpertFfn int4 rows" >> $S
grep -E "^=== |ExpertFfn T .* int4" $OUT/matvec.txt >> $S
: > $OUT/moe.txt
for r in 1 2; do
  for mode in 0 ring; do
    echo "=== MOE_INT4_RING=$mode round $r" >> $OUT/moe.txt
    MOE_INT4_RING=$mode timeout 75 $B/moe-bench --store_dir= --batches=64,256 --steps=16 --prompt= --timings >> $OUT/moe.txt 2>&1
    echo "moe $mode r$r rc $? ($((SECONDS - T0)) s)" >> $S
  done
done
echo "== moe-bench" >> $S
grep -E "^=== |^(64|256) +[0-9]|decode tokens/s \(batch 1|batch (64|256), synchronized" $OUT/moe.txt | sed -E "s/(attention|routing|dense|logits|sampling) [^,]*, //g" >> $S
cat $S
