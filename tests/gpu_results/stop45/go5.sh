#!/bin/bash
# Stop 45, call 5: A as hi + mid + lo in GemmMmaKernel for quantized weights (this bundle):
# golden on CUDA (the batch-of-24 cases of gptq_asym, fp8, ct_fp8), the GEMM parity cases, and
# time to first token with int8 experts and with fp8 everywhere against f0e5a8c's
# libmoe_kernels.so in a copy of the same bundle.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old; xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
timeout 60 /tmp/bundle/bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1
echo "golden rc=$?" >> $S
grep -E "PASSED|FAILED  \]|batch of 24|Expected" $OUT/golden_gpu.txt | grep -E "PASSED|FAILED|asym|fp8|g128|Expected" | head -30 >> $S
for f in "--expert_format=int8" "--expert_format=fp8 --dense_format=fp8"; do
  for v in old new; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    echo "=== $v $f" >> $OUT/bench.txt
    timeout 90 $d/bin/moe-bench --model_dir=/tmp/mb_q --store_dir= --batches= --prompt=2048 $f \
      >> $OUT/bench.txt 2>&1
    echo "bench $v $f rc $?" >> $S
    grep -E "time to first token|decode tokens/s" $OUT/bench.txt | tail -2 | sed "s/^/$v $f: /" >> $S
  done
done
timeout 150 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*' > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|parity:" $OUT/parity.txt | head -20 >> $S
grep -c "^\[       OK" $OUT/parity.txt >> $S
cat $S
