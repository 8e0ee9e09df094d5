#!/bin/bash
# Stop 42, call 4: main as merged (goldfix + int4split + step graphs forget on free): the golden
# suites, exact codes A/B (MOE_EXACT_CODES=0: the old matrix-vector arithmetic), a store run.
tar xzf .device/b/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 60 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
timeout 30 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches=8,64 --steps=32 --prompt="
timeout 70 $bin/moe-bench $M > $OUT/mb_exact.txt 2>&1
timeout 50 env MOE_EXACT_CODES=0 $bin/moe-bench $M > $OUT/mb_offset.txt 2>&1
timeout 50 $bin/moe-bench $M > $OUT/mb_exact2.txt 2>&1
timeout 50 env MOE_EXACT_CODES=0 $bin/moe-bench $M > $OUT/mb_offset2.txt 2>&1
S="--model_dir=/tmp/moe_bench_model --store_dir=/tmp/moe_bench_store --batches=8 --batch_steps=16 --prompt= --store_batches=1 --store_vram_percents=100"
timeout 70 $bin/moe-bench $S > $OUT/store_graphs.txt 2>&1
timeout 100 $bin/parity_test --gtest_brief=1 --gtest_filter='*Quant*:*Gemm*:*ExactCodes*' > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
cat $OUT/gpu.txt; grep -h "rc=\|PASSED\|tests from.*ran" $OUT/golden_store_gpu.txt $OUT/golden_gpu.txt $OUT/parity.txt
grep -h "FAILED  \]" $OUT/*.txt | head -20
grep -H "decode tokens/s\|^8 \|^64 " $OUT/mb_*.txt
grep -h -A3 "^VRAM" $OUT/store_graphs.txt; grep -h "decode tokens/s\|replayed" $OUT/store_graphs.txt
