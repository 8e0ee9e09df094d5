#!/bin/bash
# Stop 44, call 1: the wgmma GEMM (gemm_mma.cu WgmmaGemmKernel, sm_90a): the GEMM parity cases,
# then time to first token A/B (MOE_GEMM_WGMMA=0: the mma.sync pipelined kernel), then decode
# batches with bf16 projections past 8 rows on the split + wgmma GEMM (MOE_GEMM_SPLIT_ABOVE=8)
# against today's threshold (256).
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 240 $bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*' > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=512,2048"
for r in 1 2; do
  timeout 150 $bin/moe-bench $M > $OUT/mb_wgmma_$r.txt 2>&1
  timeout 120 env MOE_GEMM_WGMMA=0 $bin/moe-bench $M > $OUT/mb_mmasync_$r.txt 2>&1
done
B="--model_dir=/tmp/moe_bench_model --store_dir= --prompt= --batches=64,256"
timeout 150 env MOE_GEMM_SPLIT_ABOVE=8 $bin/moe-bench $B > $OUT/mb_dec_split8.txt 2>&1
timeout 150 $bin/moe-bench $B > $OUT/mb_dec_today.txt 2>&1
cat $OUT/gpu.txt
grep -h "PASSED\|FAILED\|rc=" $OUT/parity.txt | head -30
grep -H "first token, \|tokens/s" $OUT/mb_*.txt | head -40
