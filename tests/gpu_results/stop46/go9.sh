#!/bin/bash
# Stop 46, call 9: main (ffa5a29's kernels): every kernel of a decode step at 8 and 16 sequences
# (2 layers, context 512; ncu device times), for the next stop's profile.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for n in 8 16; do
  MOE_PROFILE_STEP_ONLY=1 timeout 60 tests/bench/profile_decode_step.sh $OUT/s$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
  rm -f $OUT/s$n/step.csv; mv $OUT/s$n/step.txt $OUT/step$n.txt; rm -rf $OUT/s$n
done
cat $S $OUT/step8.txt
