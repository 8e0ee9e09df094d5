#!/bin/bash
# Stop 47, call 2: the matrix-vector kernels' K slices as clusters of blocks, each staging only its
# slice of x, against 418c46a's kernels (the same bundle with the old libmoe_kernels.so).
# GEMM parity first, then moe-bench at 1-16 sequences, interleaved, 2 rounds; the 8-sequence
# step's kernels on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 150 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*:*Routed*' \
  > $OUT/parity_gemm.txt 2>&1
echo "parity gemm rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity_gemm.txt | head -20 >> $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=2,4,8,16 --prompt=512 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(2|4|8|16) +[0-9]+\.[0-9] +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt \
      | tail -6 | sed "s/^/$v $r: /" >> $S
  done
done
for n in 1 8; do
  MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/s$n/step.csv; mv $OUT/s$n/step.txt $OUT/step$n.txt; rm -rf $OUT/s$n
done
head -20 $OUT/step8.txt >> $S; grep total $OUT/step1.txt >> $S
cat $S
