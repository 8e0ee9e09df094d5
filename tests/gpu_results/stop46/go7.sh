#!/bin/bash
# Stop 46, call 7: bf16 matrices of at most one GEMM tile of weight rows (the router) on the
# matrix-vector kernel up to 64 rows of A (this bundle) against c884098's libmoe_kernels.so in a
# copy of it. moe-bench at 16/32/64/256 sequences interleaved (2 rounds), the 64-sequence step's
# kernels, the MatMul parity cases and the golden suite on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 80 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=16,32,64,256 --prompt= >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(16|32|64|256) +[0-9]+\.[0-9] +[0-9]" $OUT/bench.txt | tail -4 | sed "s/^/$v $r: /" >> $S
  done
done
MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s64 64 > /dev/null 2>&1
echo "step 64 rc $?" >> $S
rm -f $OUT/s64/step.csv; mv $OUT/s64/step.txt $OUT/step64.txt; rm -rf $OUT/s64
sed -n 14,21p $OUT/step64.txt >> $S
timeout 100 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*' > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|cases," $OUT/parity.txt | head >> $S
timeout 100 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden.txt | head >> $S
cat $S
