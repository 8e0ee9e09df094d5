#!/bin/bash
# Stop 43, call 1: the prefill attention kernel (prefill_attention.cuh): its parity cases and the
# paged suite, then time to first token A/B (MOE_PREFILL_ATTENTION=0: the decode kernel), with
# the per-phase timings of one 2,048-token prefill each way.
tar xJf .device/b/bundle.txz -C /tmp; bin=/tmp/bundle/bin
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
timeout 120 $bin/parity_test --gtest_filter='*PagedKv*' > $OUT/parity_paged.txt 2>&1; echo "parity rc=$?" >> $OUT/parity_paged.txt
M="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=512,2048"
for r in 1 2; do
  timeout 150 $bin/moe-bench $M > $OUT/mb_new_$r.txt 2>&1
  timeout 120 env MOE_PREFILL_ATTENTION=0 $bin/moe-bench $M > $OUT/mb_old_$r.txt 2>&1
done
T="--model_dir=/tmp/moe_bench_model --store_dir= --batches= --prompt=2048 --timings"
timeout 100 $bin/moe-bench $T > $OUT/timings_new.txt 2>&1
timeout 100 env MOE_PREFILL_ATTENTION=0 $bin/moe-bench $T > $OUT/timings_old.txt 2>&1
cat $OUT/gpu.txt
grep -h "PASSED\|FAILED\|rc=" $OUT/parity_paged.txt | head -20
grep -H "first token, \|decode tokens/s" $OUT/mb_*.txt
grep -h -i -A30 "prefill\|phase" $OUT/timings_new.txt | head -50
