#!/usr/bin/env bash
# goldfix, second call (not run): the speed A/B that the first call's 30 s timeouts cut, and the
# trained_default golden cases (their model_dir is engine/default_model). MOE_EXACT_CODES=0 is
# the old arithmetic in the same binaries. Bundle of the branch's head (87eecea's kernels).
cd "$(dirname "$0")/../.."
tar xzf .device/gold/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
mkdir -p /work/wt-gold/tests/golden /work/wt-gold/engine
ln -sfn $PWD/tests/golden/fixtures /work/wt-gold/tests/golden/fixtures
ln -sfn $PWD/engine/default_model /work/wt-gold/engine/default_model
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
for i in 1 2; do for e in 0 1; do
  echo "=== MOE_EXACT_CODES=$e run $i"; MOE_EXACT_CODES=$e timeout 100 $bin/matvec_bench
done; done > $OUT/matvec_ab.txt 2>&1
timeout 60 $bin/golden_gpu_test > $OUT/golden.txt 2>&1; echo "rc $? at ${SECONDS}s" >> $OUT/golden.txt
grep -E "int8|int4|===" $OUT/matvec_ab.txt; grep -E "PASSED|FAILED  \]|rc " $OUT/golden.txt
