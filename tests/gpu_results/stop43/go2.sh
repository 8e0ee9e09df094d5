#!/bin/bash
# Stop 43, call 2: the prefill kernel with fp8 caches and with chunks among decodes (the paged
# parity suite), the golden suite on CUDA (with the merged FP8-loader reference), time to first
# token A/B (MOE_PREFILL_ATTENTION=0) with bf16 and fp8 caches, and a per-kernel profile of a
# 2,048-token prefill on 2 layers (tests/bench/profile_prefill.sh, ncu).
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin; ln -sfn /tmp/bundle bundle
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 120 $bin/parity_test --gtest_filter='*PagedKv*' > $OUT/parity_paged.txt 2>&1; echo "parity rc=$?" >> $OUT/parity_paged.txt
timeout 40 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=512,2048"
for r in 1 2; do
  for kv in bf16 fp8_e4m3; do
    timeout 150 $bin/moe-bench $M --kv_cache_dtype=$kv > $OUT/mb_new_${kv}_$r.txt 2>&1
    timeout 120 env MOE_PREFILL_ATTENTION=0 $bin/moe-bench $M --kv_cache_dtype=$kv > $OUT/mb_old_${kv}_$r.txt 2>&1
  done
done
timeout 150 bash tests/bench/profile_prefill.sh $OUT/prof 2048 > /dev/null 2>&1
cat $OUT/gpu.txt
grep -h "PASSED\|FAILED\|rc=" $OUT/parity_paged.txt $OUT/golden_gpu.txt | head -20
grep -H "first token, " $OUT/mb_*.txt
head -25 $OUT/prof/prefill.txt
