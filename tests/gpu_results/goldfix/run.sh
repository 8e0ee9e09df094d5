#!/usr/bin/env bash
# goldfix: exact codes in the matrix-vector kernels. golden_gpu_test new and old (MOE_EXACT_CODES=0
# is the old arithmetic, same binaries), parity, speed A/B by matvec_bench.
cd "$(dirname "$0")/../.."
tar xzf .device/gold/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
mkdir -p /work/wt-gold/tests/golden && ln -sfn $PWD/tests/golden/fixtures /work/wt-gold/tests/golden/fixtures
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
timeout 60 $bin/golden_gpu_test > $OUT/golden_new.txt 2>&1; echo "rc $? at ${SECONDS}s" >> $OUT/golden_new.txt
MOE_EXACT_CODES=0 timeout 30 $bin/golden_gpu_test --gtest_filter='*/10:*/12:*/13' > $OUT/golden_old.txt 2>&1; echo "rc $? at ${SECONDS}s" >> $OUT/golden_old.txt
MOE_EXACT_CODES=0 timeout 20 $bin/parity_test --gtest_filter='QuantMatMulExactCodes*' > $OUT/parity_old_exactcodes.txt 2>&1; echo "rc $? at ${SECONDS}s" >> $OUT/parity_old_exactcodes.txt
{ for i in 1 2; do for e in 0 1; do echo "=== MOE_EXACT_CODES=$e run $i"; MOE_EXACT_CODES=$e timeout 30 $bin/matvec_bench 2>&1 | grep -E "int8|int4|device|copy"; done; done; echo "at ${SECONDS}s"; } > $OUT/matvec_ab.txt 2>&1
timeout $((285 - SECONDS)) $bin/parity_test --gtest_filter='*Quant*:*MatMul*:*ExpertFfn*' > $OUT/parity_new.txt 2>&1; echo "rc $? at ${SECONDS}s" >> $OUT/parity_new.txt
grep -h "rc \|FAILED  \]\|parity:\|at [0-9]*s" $OUT/*.txt | head -60
