#!/bin/bash
# Stop 45, call 2: the int4 code pairs in one lop3 and x's fragments as register pairs (this
# bundle) against main's libmoe_kernels.so (3b1c0f6) in a copy of the same bundle. matvec_bench
# and moe-bench interleaved, then the GEMM/matrix-vector parity cases on the new kernels.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old; xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for v in old new; do
  d=/tmp/bundle; [ $v = old ] && d=/tmp/old
  timeout 100 $d/bin/matvec_bench > $OUT/matvec_$v.txt 2>&1; echo "matvec $v rc $?" >> $S
  grep -E "ExpertFfn T (8|256) top-8 \(.*int4 g64|ExpertFfn T 1 H|int4 g64 +175" $OUT/matvec_$v.txt >> $S
done
for r in 1 2; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v round $r" >> $OUT/bench.txt
    timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,64,256 --prompt=2048 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|64|256) +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt | tail -5 \
      | sed "s/^/$v $r: /" >> $S
  done
done
timeout 170 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*:*Routed*' \
  > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity.txt | head -20 >> $S
cat $S
