#!/bin/bash
# Stop 44, call 8: the GEMMs' quant-group index by shifts, not 64-bit divisions (19 div.s64 in
# the int4 wgmma kernel's PTX before, 1 after): GEMM parity and golden on CUDA on the new bundle,
# then time to first token, the previous bundle (commit 60bfda9) against this one, interleaved.
# prev: this bundle with the previous commit's libmoe_kernels.so (the only library that differs).
mkdir -p /tmp/new /tmp/prev
tar xJf .device/b/bundle.txz -C /tmp/new; tar xJf .device/b/bundle.txz -C /tmp/prev
xz -dc .device/b/prev_libmoe_kernels.so.xz > /tmp/prev/bundle/lib/libmoe_kernels.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 150 /tmp/new/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*' > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/parity.txt
timeout 60 /tmp/new/bundle/bin/golden_gpu_test --gtest_brief=1 > $OUT/golden_gpu.txt 2>&1; echo "golden rc=$?" >> $OUT/golden_gpu.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=512,2048"
for r in 1 2; do
  for b in new prev; do
    echo "== $b $r" >> $OUT/ttft.txt; timeout 150 /tmp/$b/bundle/bin/moe-bench $M > /tmp/mb.txt 2>&1
    grep "first token" /tmp/mb.txt >> $OUT/ttft.txt
  done
done
cat $OUT/gpu.txt; grep -h "PASSED\|FAILED  \]\|rc=" $OUT/parity.txt $OUT/golden_gpu.txt | head; cat $OUT/ttft.txt
