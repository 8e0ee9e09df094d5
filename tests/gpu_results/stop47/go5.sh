#!/bin/bash
# Stop 47, call 5: the int4 walk kernel for one n-tile too (expert groups of up to 8 rows: 32-64
# sequences), against de0bc22's kernels (the same bundle with that libmoe_kernels.so). Parity of
# the int4 and expert kernels first; moe-bench at 8-256 sequences, interleaved, 2 rounds; the
# 64-sequence step's kernels on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 170 /tmp/bundle/bin/parity_test --gtest_filter='*ExpertFfn*:*Routed*:*QuantMatMul*' \
  > $OUT/parity_part.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity_part.txt | head -20 >> $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 120 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,32,64,128,256 --prompt=512 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|32|64|128|256) +[0-9]+\.[0-9] +[0-9]" $OUT/bench.txt \
      | tail -5 | sed "s/^/$v $r: /" >> $S
  done
done
MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s64 64 > /dev/null 2>&1
echo "step 64 rc $?" >> $S
rm -f $OUT/s64/step.csv; mv $OUT/s64/step.txt $OUT/step64.txt; rm -rf $OUT/s64
grep -E "Int4|Walk|total" $OUT/step64.txt >> $S
cat $S
