#!/bin/bash
# Stop 47, call 7: the routed experts planned (sorted into groups) from half as many pairs as
# experts (8-16 sequences on 128 experts top-8), against 11fbe3d's kernels (per-pair groups up to
# one pair an expert; the same bundle with that libmoe_kernels.so). Routed parity first; moe-bench
# at 1-16 sequences, interleaved, 2 rounds; the 8- and 16-sequence steps' kernels on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 90 /tmp/bundle/bin/parity_test --gtest_filter='*ExpertFfnRouted*' > $OUT/parity_part.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity_part.txt | head -20 >> $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=4,8,12,16 --prompt=512 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(4|8|12|16) +[0-9]+\.[0-9] +[0-9]|decode tokens/s \(batch 1" $OUT/bench.txt \
      | tail -5 | sed "s/^/$v $r: /" >> $S
  done
done
for n in 8 16; do
  MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/s$n/step.csv; mv $OUT/s$n/step.txt $OUT/step$n.txt; rm -rf $OUT/s$n
  grep -E "Int4|Plan|total" $OUT/step$n.txt | head -4 >> $S
done
cat $S
