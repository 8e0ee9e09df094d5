#!/bin/bash
# Stop 42, call 5: the service at 1/16/64/128 streams with the VRAM tier preloaded at start
# (moe-worker --preload_experts, default on), 8 s per concurrency.
root=$PWD
tar xJf .device/b/bundle.txz -C /tmp
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
cd /tmp/bundle && OUT=$OUT/svc timeout 230 bash "$root/tests/bench/service_store_bench.sh" 8 > $OUT/svc_table.txt 2>&1
echo "svc rc=$?" >> $OUT/svc_table.txt
cp $OUT/svc/worker.log $OUT/worker.log 2>/dev/null
rm -rf /tmp/moe_serve_store $OUT/svc/metrics_*
cat $OUT/gpu.txt; grep -h "preload\|budgets" $OUT/worker.log | head; tail -8 $OUT/svc_table.txt
