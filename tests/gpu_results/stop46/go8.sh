#!/bin/bash
# Stop 46, call 8: main (7e31160) with the int4 walk kernels' row-blocks a block swept
# (MOE_INT4_WALK = 3, the default, 6 and 2), 128 and 256 sequences, two interleaved rounds.
set -u
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $S
for r in 1 2; do
  for w in 3 6 2; do
    echo "=== walk $w round $r" >> $OUT/bench.txt
    MOE_INT4_WALK=$w timeout 60 /tmp/bundle/bin/moe-bench --model_dir=/tmp/moe_bench_model \
      --store_dir= --batches=128,256 --prompt= >> $OUT/bench.txt 2>&1
    echo "bench walk $w round $r rc $?" >> $S
    grep -E "^(128|256) +[0-9]+\.[0-9] +[0-9]" $OUT/bench.txt | tail -2 | sed "s/^/walk $w $r: /" >> $S
  done
done
cat $S
