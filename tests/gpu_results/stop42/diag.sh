#!/bin/bash
# Stop 42, call 3: golden_store_gpu_test's segfault (qwen3_5_moe, after budget host): with and
# without step graphs, and a backtrace.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
F='--gtest_filter=*/16:*/17:*/18:*/19:*/20:*/21:*/22:*/23:*/24:*/25:*/26:*/27:*/28:*/29:*/30:*/31:Published*:Quantized*'
timeout 60 env MOE_CUDA_GRAPHS=0 $bin/golden_store_gpu_test "$F" > $OUT/nographs.txt 2>&1; echo "nographs rc=$?" >> $OUT/nographs.txt
timeout 60 $bin/golden_store_gpu_test "$F" > $OUT/graphs.txt 2>&1; echo "graphs rc=$?" >> $OUT/graphs.txt
timeout 120 cuda-gdb -batch -ex run -ex bt -ex "info threads" --args $bin/golden_store_gpu_test "$F" > $OUT/gdb.txt 2>&1
cat $OUT/gpu.txt; grep -h "rc=\|FAILED  \]\|PASSED" $OUT/nographs.txt $OUT/graphs.txt
grep -v "^\[New Thread\|^\[Thread" $OUT/gdb.txt | grep -A40 "SIG\|signal" | head -60
