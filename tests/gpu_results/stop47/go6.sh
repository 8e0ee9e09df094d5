#!/bin/bash
# Stop 47, call 6: the final kernels (11fbe3d). The whole GPU suite (parity, both golden suites),
# then moe-bench's figures of record against 418c46a's kernels (the stop's start; the same bundle
# with that libmoe_kernels.so), one round each.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 240 /tmp/bundle/bin/parity_test > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|compared" $OUT/parity.txt | head -20 >> $S
timeout 100 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden.txt | head >> $S
timeout 100 /tmp/bundle/bin/golden_store_gpu_test > $OUT/golden_store.txt 2>&1
echo "golden store rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden_store.txt | head >> $S
for v in old new; do
  d=/tmp/bundle; [ $v = old ] && d=/tmp/old
  echo "=== $v" >> $OUT/bench.txt
  timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
    --batches=8,64,256 --prompt=512,2048 >> $OUT/bench.txt 2>&1
  echo "bench $v rc $?" >> $S
  grep -E "^(8|64|256) +[0-9]+\.[0-9] +[0-9]|decode tokens/s \(batch 1|time to first token" \
    $OUT/bench.txt | tail -6 | sed "s/^/$v: /" >> $S
done
cat $S
