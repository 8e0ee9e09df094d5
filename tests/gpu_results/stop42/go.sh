#!/bin/bash
# Stop 42, call 1: the split-A GEMM A/B (MOE_GEMM_SPLIT=0 = the old GEMM), the suite on this code,
# and store-backed steps as CUDA graphs (store path at 100% VRAM vs resident; MOE_CUDA_GRAPHS=0).
tar xzf .device/b/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches=8,64,256 --steps=16 --prompt=512,2048"
for r in 1 2; do
  timeout 150 $bin/moe-bench $M > $OUT/mb_split_$r.txt 2>&1
  timeout 120 env MOE_GEMM_SPLIT=0 $bin/moe-bench $M > $OUT/mb_old_$r.txt 2>&1
done
S="--model_dir=/tmp/moe_bench_model --store_dir=/tmp/moe_bench_store --batches= --prompt= --store_batches=1,8 --store_vram_percents=100 --timings"
timeout 100 $bin/moe-bench $S > $OUT/store_graphs.txt 2>&1
timeout 60 env MOE_CUDA_GRAPHS=0 $bin/moe-bench $S > $OUT/store_nographs.txt 2>&1
timeout 170 $bin/parity_test --gtest_brief=1 > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
timeout 30 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
timeout 60 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
cat $OUT/gpu.txt
grep -H "decode tokens/s\|2048-token prompt\|^8 \|^64 \|^256 " $OUT/mb_*.txt
grep -h -A12 "offload\|store" $OUT/store_graphs.txt | head -40
grep -h "tokens/s\|ms a step" $OUT/store_nographs.txt | head
tail -3 $OUT/parity.txt $OUT/golden_gpu.txt $OUT/golden_store_gpu.txt
grep -h "FAILED" $OUT/*.txt | head -20
