#!/bin/bash
# Stop 44, call 2: where a 2,048-token prefill goes with the wgmma GEMM (ncu per kernel, then
# ncu's sections on the first three wgmma launches); decode batches of 8-48 with bf16 projections
# on the split + wgmma GEMM from 9 rows (MOE_GEMM_SPLIT_ABOVE=8) against today's 256.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin; ln -sfn /tmp/bundle bundle
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 300 tests/bench/profile_prefill.sh $OUT/prof 2048 > /dev/null 2>&1
cp $OUT/prof/prefill.txt $OUT/prefill.txt; cp $OUT/prof/gemm_ncu.txt $OUT/gemm_ncu.txt; rm -rf $OUT/prof
B="--model_dir=/tmp/moe_bench_model --store_dir= --prompt= --batches=8,16,32,48"
for r in 1 2; do
  timeout 100 env MOE_GEMM_SPLIT_ABOVE=8 $bin/moe-bench $B > $OUT/dec_split8_$r.txt 2>&1
  timeout 100 $bin/moe-bench $B > $OUT/dec_today_$r.txt 2>&1
done
cat $OUT/gpu.txt; head -25 $OUT/prefill.txt
grep -A5 "^B  " $OUT/dec_*.txt
