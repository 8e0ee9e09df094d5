#!/bin/bash
# Stop 46, call 3: q/k/v in one GEMM at T > 1 (SplitColumns on 16-byte units) and HeadNormRope a
# warp a row (this bundle; the walk change of call 2 reverted) against 616638f's
# libmoe_kernels.so and libmoe_engine.so in a copy of the same bundle (the new virtual is the
# Backend's last, Model's new member its last: the old libraries run under the new moe-bench).
# moe-bench interleaved (2 rounds), the step's kernels at 64 and 256 sequences, then the parity
# cases of the changed kernels and both golden suites on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
xz -dc .device/b/old_engine.so.xz > /tmp/old/lib/libmoe_engine.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,64,256 --prompt=512,2048 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|64|256) +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt | tail -6 \
      | sed "s/^/$v $r: /" >> $S
  done
done
for n in 256 64; do
  MOE_PROFILE_STEP_ONLY=1 timeout 100 tests/bench/profile_decode_step.sh $OUT/step$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/step$n/step.csv; mv $OUT/step$n/step.txt $OUT/step$n.txt; rm -rf $OUT/step$n
done
timeout 150 /tmp/bundle/bin/parity_test --gtest_filter='*Rope*:*SplitColumns*:*MatMul*' \
  > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity.txt | head -20 >> $S
timeout 150 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|batched step max" $OUT/golden.txt | head -30 >> $S
timeout 150 /tmp/bundle/bin/golden_store_gpu_test > $OUT/golden_store.txt 2>&1
echo "golden store rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden_store.txt | head >> $S
cat $S
