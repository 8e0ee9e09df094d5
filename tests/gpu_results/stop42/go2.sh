#!/bin/bash
# Stop 42, call 2: the suite on main + int4split (k-split fix, 256-row threshold, aligned pinned
# memory), store steps as graphs (moe-bench store path, with and without MOE_CUDA_GRAPHS=0), and
# the service at 1/16/64/128 streams (tests/bench/service_store_bench.sh).
root=$PWD
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 175 $bin/parity_test --gtest_brief=1 > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
timeout 20 $bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
timeout 60 $bin/golden_store_gpu_test --gtest_brief=1 > $OUT/golden_store_gpu.txt 2>&1; echo "golden_store rc=$?" >> $OUT/golden_store_gpu.txt
S="--model_dir=/tmp/moe_bench_model --store_dir=/tmp/moe_bench_store --batches=8 --batch_steps=16 --prompt= --store_batches=1,8 --store_vram_percents=100"
timeout 90 $bin/moe-bench $S > $OUT/store_graphs.txt 2>&1
timeout 60 env MOE_CUDA_GRAPHS=0 $bin/moe-bench $S > $OUT/store_nographs.txt 2>&1
rm -rf /tmp/moe_bench_store /tmp/moe_bench_model
cd /tmp/bundle && OUT=$OUT/svc timeout 230 bash "$root/tests/bench/service_store_bench.sh" 15 > $OUT/svc_table.txt 2>&1
echo "svc rc=$?" >> $OUT/svc_table.txt
rm -rf /tmp/moe_serve_store
cat $OUT/gpu.txt; tail -3 $OUT/parity.txt; tail -2 $OUT/golden_gpu.txt $OUT/golden_store_gpu.txt
grep -h "FAILED  \]" $OUT/*.txt | head -20
grep -h -B2 -A8 "offload\|VRAM" $OUT/store_graphs.txt | head -30
grep -h "decode tokens/s\|^1 \|^8 \|replayed" $OUT/store_nographs.txt | head
tail -8 $OUT/svc_table.txt
