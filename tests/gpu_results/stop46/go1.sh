#!/bin/bash
# Stop 46, call 1: main as it is (616638f). Every kernel of a decode step at 256 and at 64
# sequences (2 layers, context 512; ncu device times), then ncu sections on the 256-sequence
# step's paged attention, its int4 down walk kernel and its q/k/v GEMM.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
B=/tmp/bundle/bin; S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for n in 256 64; do
  MOE_PROFILE_STEP_ONLY=1 timeout 200 tests/bench/profile_decode_step.sh $OUT/step$n $n > /dev/null 2>&1
  echo "step $n rc $?" >> $S
done
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats
  --section SchedulerStats --section MemoryWorkloadAnalysis)
for k in DecodeAttentionKernel 'Int4MmaWalkKernel<false' 'WgmmaGemmKernel' 'AttentionCombine'; do
  timeout 120 ncu --clock-control none "${sections[@]}" -k regex:"$k" --launch-skip 4 --launch-count 1 \
    $B/moe-bench --kv_only --layers=2 --model_dir=/tmp/profile_model --kv_contexts=512 \
    --kv_batches=256 --kv_steps=1 --kv_formats=bf16 > "$OUT/ncu_${k%%<*}.txt" 2>&1
  echo "ncu $k rc $?" >> $S
done
cat $S; cat $OUT/step256/step.txt $OUT/step64/step.txt
