#!/bin/bash
# Stop 45, call 6: the whole parity suite and the store golden on the final kernels (5cc5ea6),
# in what device time is left.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
timeout 40 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
timeout 200 $bin/parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
cat $OUT/gpu.txt; grep -h "PASSED\|FAILED  \]\|rc=\|parity:" $OUT/parity.txt $OUT/golden_store_gpu.txt | head; grep -c "^\[       OK" $OUT/parity.txt
