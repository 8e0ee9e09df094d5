#!/bin/bash
# Stop 42, call 6: main + fp8 (merged): the whole parity suite and the golden suites on CUDA.
tar xzf .device/b/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 25 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
timeout 50 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
timeout 190 $bin/parity_test --gtest_brief=1 > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
cat $OUT/gpu.txt; grep -h "rc=\|PASSED\|tests from.*ran\|cases" $OUT/golden_gpu.txt $OUT/golden_store_gpu.txt $OUT/parity.txt
grep -h "FAILED  \]\|check failed\|Abort" $OUT/*.txt | head -20
