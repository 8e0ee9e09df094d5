#!/bin/bash
# Stop 46, call 2: the int4 walk's loads running on across row-blocks and q/k/v in one GEMM at
# T > 1 (this bundle) against main's 616638f libmoe_kernels.so and libmoe_engine.so in a copy of
# the same bundle. matvec_bench old/new, moe-bench interleaved (2 rounds; also the new with
# MOE_GEMM_SPLITK=0), the step's kernels at 8 and 256 sequences (and 256 without the K split),
# then the GEMM/matrix-vector parity cases and the golden suite on the new.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
cp -a /tmp/bundle /tmp/old
xz -dc .device/b/old_kernels.so.xz > /tmp/old/lib/libmoe_kernels.so
xz -dc .device/b/old_engine.so.xz > /tmp/old/lib/libmoe_engine.so
[ -d /work/main/tests/golden/fixtures ] || { mkdir -p /work/main/tests/golden && ln -sfn "$PWD/tests/golden/fixtures" /work/main/tests/golden/fixtures; }
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for v in old new; do
  d=/tmp/bundle; [ $v = old ] && d=/tmp/old
  timeout 100 $d/bin/matvec_bench > $OUT/matvec_$v.txt 2>&1; echo "matvec $v rc $?" >> $S
  grep -E "ExpertFfn T (8|256) top-8 \(.*int4 g64|ExpertFfn T 1 H|int4 g64 +175" $OUT/matvec_$v.txt >> $S
done
for r in 1 2; do
  for v in old new nosplitk; do
    d=/tmp/bundle; [ $v = old ] && d=/tmp/old
    k=1; [ $v = nosplitk ] && k=0
    echo "=== $v round $r" >> $OUT/bench.txt
    MOE_GEMM_SPLITK=$k timeout 100 $d/bin/moe-bench --model_dir=/tmp/moe_bench_model --store_dir= \
      --batches=8,64,256 --prompt=2048 >> $OUT/bench.txt 2>&1
    echo "bench $v round $r rc $?" >> $S
    grep -E "^(8|64|256) +[0-9]|decode tokens/s|time to first token" $OUT/bench.txt | tail -5 \
      | sed "s/^/$v $r: /" >> $S
  done
done
for n in 256 8; do
  MOE_PROFILE_STEP_ONLY=1 timeout 100 tests/bench/profile_decode_step.sh $OUT/step$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/step$n/step.csv
done
MOE_GEMM_SPLITK=0 MOE_PROFILE_STEP_ONLY=1 timeout 100 tests/bench/profile_decode_step.sh $OUT/step256_nosplitk 256 > /dev/null 2>&1
echo "step 256 nosplitk rc $?" >> $S; rm -f $OUT/step256_nosplitk/step.csv
timeout 170 /tmp/bundle/bin/parity_test --gtest_filter='*MatMul*:*ExpertFfn*:*Routed*' \
  > $OUT/parity.txt 2>&1
echo "parity rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|tests ran" $OUT/parity.txt | head -20 >> $S
timeout 150 /tmp/bundle/bin/golden_gpu_test > $OUT/golden.txt 2>&1
echo "golden rc $?" >> $S
grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $OUT/golden.txt | head -20 >> $S
cat $S
