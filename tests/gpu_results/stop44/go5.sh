#!/bin/bash
# Stop 44, call 5: decode batches with the routed experts planned in chunks of 128 rows
# (MOE_ROUTED_CHUNK=128: every expert's tokens one group, the GEMM on wgmma with N by the group's
# rows) against today's chunks of 8/16 for the matrix-vector kernels.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
B="--model_dir=/tmp/moe_bench_model --store_dir= --prompt= --batches=32,64,128,256"
for r in 1 2; do
  echo "== chunks 128 $r" >> $OUT/dec.txt; timeout 150 env MOE_GEMM_SPLIT_ABOVE=8 MOE_ROUTED_CHUNK=128 $bin/moe-bench $B >> $OUT/dec.txt 2>&1
  echo "== today $r" >> $OUT/dec.txt; timeout 150 env MOE_GEMM_SPLIT_ABOVE=8 $bin/moe-bench $B >> $OUT/dec.txt 2>&1
done
grep -A6 "==\|^B  " $OUT/dec.txt | grep "==\|^[0-9]"
