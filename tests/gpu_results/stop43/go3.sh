#!/bin/bash
# Stop 43, call 3: the int4 GEMM's tall block tile (128 rows, warps of 64 x 32) A/B against the
# 64-row tile (MOE_GEMM_TALL=0) and with bf16 too (MOE_GEMM_TALL=all) on time to first token, then
# the whole suite on this code: parity (the GEMM cases also with MOE_GEMM_TALL=all), golden on
# CUDA, golden through the store. At most 8 files come back: logs are concatenated.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=2048"
for r in 1 2; do
  for t in int4 0 all; do
    echo "== MOE_GEMM_TALL=$t round $r" >> $OUT/ttft.txt
    if [ $t = int4 ]; then timeout 150 $bin/moe-bench $M > /tmp/mb.txt 2>&1
    else timeout 150 env MOE_GEMM_TALL=$t $bin/moe-bench $M > /tmp/mb.txt 2>&1; fi
    grep "first token\|decode tokens/s\|TFLOP/s" /tmp/mb.txt >> $OUT/ttft.txt
  done
done
timeout 60 env MOE_GEMM_TALL=all $bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*:*Routed*' > $OUT/parity_tall_all.txt 2>&1; echo "parity (tall all) rc=$?" >> $OUT/parity_tall_all.txt
timeout 240 $bin/parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
timeout 40 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
timeout 60 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
cat $OUT/gpu.txt; cat $OUT/ttft.txt
grep -h "PASSED\|FAILED  \]\|rc=" $OUT/parity_tall_all.txt $OUT/parity.txt $OUT/golden_gpu.txt $OUT/golden_store_gpu.txt | head -30
