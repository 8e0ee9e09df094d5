#!/bin/bash
# Stop 47, call 4: the router in chunks of 8 rows on the tensor-core matrix-vector kernel (past 8
# rows, one GEMM tile column) and the decode attention's splits rounded down to one wave, against
# 61ccab2's kernels (the same bundle with that libmoe_kernels.so). Parity of the GEMMs and the
# attention first; moe-bench at 8-256 sequences, interleaved, 2 rounds; the 16- and 64-sequence
# steps' kernels on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 200 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*Attention*:*PagedKv*' \
  > $OUT/parity_part.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity_part.txt | head -20 >> $S
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 120 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,16,32,64,256 --prompt=512 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|16|32|64|256) +[0-9]+\.[0-9] +[0-9]|decode tokens/s \(batch 1" $OUT/bench.txt \
      | tail -6 | sed "s/^/$v $r: /" >> $S
  done
done
for n in 16 64; do
  MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/s$n/step.csv; mv $OUT/s$n/step.txt $OUT/step$n.txt; rm -rf $OUT/s$n
done
head -30 $OUT/step64.txt >> $S
cat $S
