#!/bin/bash
# Stop 47, call 8: the final code (the planned threshold as committed, row_chunk's clamp): both
# golden suites, the routed-expert and MatMul parity cases.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 30 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|g128: batched" $OUT/golden.txt | head >> $S
timeout 30 /tmp/bundle/bin/golden_store_gpu_test > $OUT/golden_store.txt 2>&1
echo "golden store rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden_store.txt | head >> $S
timeout 80 /tmp/bundle/bin/parity_test --gtest_filter='*ExpertFfnRouted*:*MatMulParity*' \
  > $OUT/parity_part.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran|cases," $OUT/parity_part.txt | head >> $S
cat $S
