#!/bin/bash
# Stop 46, call 4: HeadNormRope with one row a block where rows are few (batch 1) and four where
# they are many. Batch-1 decode and 8/64 sequences against 616638f's libraries (as call 3,
# interleaved, 2 rounds), the batch-1 step's kernels old and new, the rope parity cases.
set -u
R=$PWD
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
xz -dc .device/b/old_engine.so.xz > /tmp/old/lib/libmoe_engine.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,64 --prompt= >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|64|256) +[0-9]|decode tokens/s" $OUT/bench.txt | tail -3 | sed "s/^/$v $r: /" >> $S
  done
done
MOE_PROFILE_STEP_ONLY=1 timeout 100 tests/bench/profile_decode_step.sh $OUT/s1new 1 > /dev/null 2>&1
echo "step 1 new rc $?" >> $S
mkdir -p /tmp/oldrun && cd /tmp/oldrun && ln -sfn /tmp/old bundle
MOE_PROFILE_STEP_ONLY=1 timeout 100 bash $R/tests/bench/profile_decode_step.sh $OUT/s1old 1 > /dev/null 2>&1
echo "step 1 old rc $?" >> $S
cd $R
for v in new old; do rm -f $OUT/s1$v/step.csv; mv $OUT/s1$v/step.txt $OUT/step1_$v.txt; rm -rf $OUT/s1$v; done
grep -E "HeadNormRope|total" $OUT/step1_new.txt | sed 's/^/new: /' >> $S
grep -E "HeadNormRope|total" $OUT/step1_old.txt | sed 's/^/old: /' >> $S
timeout 100 /tmp/bundle/bin/parity_test --gtest_filter='*Rope*:*SplitColumns*' > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/parity.txt | head >> $S
cat $S
