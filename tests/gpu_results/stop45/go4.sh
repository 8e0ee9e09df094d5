#!/bin/bash
# Stop 45, call 4: the suite on this stop's final kernels (commit f0e5a8c): parity, golden on CUDA, store golden and
# moe-bench's table for the figures of record.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 280 $bin/parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
timeout 60 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
timeout 60 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
timeout 200 $bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= --batches=8,64,256 --prompt=512,2048 > $OUT/mb.txt 2>&1
cat $OUT/gpu.txt
grep -h "PASSED\|FAILED  \]\|rc=\|parity:" $OUT/parity.txt $OUT/golden_gpu.txt $OUT/golden_store_gpu.txt | head -30
grep -A5 "first token\|decode tokens\|^B  " $OUT/mb.txt | head -40
