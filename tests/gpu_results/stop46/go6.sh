#!/bin/bash
# Stop 46, call 6: bf16 GEMMs split over K where that takes a quarter or more off their waves (this
# bundle) against c884098's libmoe_kernels.so in a copy of it (the engine is the same). moe-bench
# interleaved (2 rounds), the 256-sequence step's kernels, the GEMM parity cases.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,64,256 --prompt=512,2048 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|64|256) +[0-9]+\.[0-9] +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt \
      | tail -6 | sed "s/^/$v $r: /" >> $S
  done
done
MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s256 256 > /dev/null 2>&1
echo "step 256 rc $?" >> $S
rm -f $OUT/s256/step.csv; mv $OUT/s256/step.txt $OUT/step256.txt; rm -rf $OUT/s256
head -8 $OUT/step256.txt >> $S
timeout 150 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*' > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|cases," $OUT/parity.txt | head >> $S
cat $S
