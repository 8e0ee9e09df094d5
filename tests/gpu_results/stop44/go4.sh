#!/bin/bash
# Stop 44, call 4: the wgmma GEMM with N by the tile's rows (16/32/64) and bf16 decode GEMMs on it
# from 49 rows: GEMM parity; time to first token A/B (MOE_GEMM_WGMMA=0); decode batches at the new
# threshold (48) against from 9 rows (MOE_GEMM_SPLIT_ABOVE=8); the prefill's kernels (ncu).
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin; ln -sfn /tmp/bundle bundle
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 240 $bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*' > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=512,2048"
for r in 1 2; do
  echo "== wgmma $r" >> $OUT/ttft.txt; timeout 150 $bin/moe-bench $M >> $OUT/ttft.txt 2>&1
  echo "== mma.sync $r" >> $OUT/ttft.txt; timeout 150 env MOE_GEMM_WGMMA=0 $bin/moe-bench $M >> $OUT/ttft.txt 2>&1
done
B="--model_dir=/tmp/moe_bench_model --store_dir= --prompt= --batches=16,32,64,256"
for r in 1 2; do
  echo "== split above 48 $r" >> $OUT/dec.txt; timeout 150 $bin/moe-bench $B >> $OUT/dec.txt 2>&1
  echo "== split above 8 $r" >> $OUT/dec.txt; timeout 150 env MOE_GEMM_SPLIT_ABOVE=8 $bin/moe-bench $B >> $OUT/dec.txt 2>&1
done
timeout 300 tests/bench/profile_prefill.sh $OUT/prof 2048 > /dev/null 2>&1
cp $OUT/prof/prefill.txt $OUT/prefill.txt; cp $OUT/prof/gemm_ncu.txt $OUT/gemm_ncu.txt; rm -rf $OUT/prof
cat $OUT/gpu.txt; grep -h "PASSED\|FAILED\|rc=" $OUT/parity.txt | head -20
grep "==\|first token, " $OUT/ttft.txt
grep -A5 "==\|^B  " $OUT/dec.txt | grep "==\|^[0-9]"
head -12 $OUT/prefill.txt
