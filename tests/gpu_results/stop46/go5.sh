#!/bin/bash
# Stop 46, call 5: the final kernels (q/k/v in one GEMM at T > 1, HeadNormRope a warp a row with
# its loads at once) against 616638f's libraries (as call 3). moe-bench batch 1, 8/64/256
# sequences and both prompts, interleaved, 2 rounds; the batch-1 step's kernels; then the whole
# parity suite and both golden suites on the new.
set -u
R=$PWD
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
    grep -E "^(8|64|256) +[0-9]+\.[0-9] +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt \
      | tail -6 | sed "s/^/$v $r: /" >> $S
  done
done
MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s1 1 > /dev/null 2>&1
echo "step 1 rc $?" >> $S
rm -f $OUT/s1/step.csv; mv $OUT/s1/step.txt $OUT/step1.txt; rm -rf $OUT/s1
grep -E "HeadNormRope|total" $OUT/step1.txt >> $S
timeout 240 /tmp/bundle/bin/parity_test > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|compared" $OUT/parity.txt | head -20 >> $S
timeout 100 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden.txt | head >> $S
timeout 100 /tmp/bundle/bin/golden_store_gpu_test > $OUT/golden_store.txt 2>&1
echo "golden store rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden_store.txt | head >> $S
cat $S
