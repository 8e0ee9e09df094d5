#!/bin/bash
# Stop 44, call 3: ncu's sections (stall reasons) on the prefill's first three wgmma GEMMs.
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
sections=(--section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats
  --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats)
timeout 300 ncu --clock-control none "${sections[@]}" -k regex:'WgmmaGemm' --launch-count 8 \
  bundle/bin/moe-bench --layers=2 --model_dir=/tmp/profile_model --store_dir= \
  --batches= --context=16 --steps=1 --prompt=2048 > $OUT/wgmma_ncu.txt 2>&1
grep -E "WgmmaGemmKernel|Duration|Throughput|Stall|Issued Warp|Eligible|Cycles Per Issued|Occupancy|Registers|Executed Ipc|Shared Memory|Bank" $OUT/wgmma_ncu.txt | head -200
