#!/usr/bin/env bash
# svcload r2: issue 27 "through the service" on a 30B-shaped store (service_store_bench.sh, streams
# at temperature 1), then two checks of the batch-1 gap: the engine alone on the store
# (moe-generate) and moe-bench's own store path with every expert in VRAM (--store_vram_percents=100).
set -u
root=$PWD
log=/tmp/svc_logs
mkdir -p "$log" "$OUT/service_stop41"
tar xzf .device/svcload/bundle.tgz -C /tmp
cd /tmp/bundle
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; df -h /tmp; } 2>&1 | tee "$log/machine.txt"
OUT=$log/r2 timeout 220 bash "$root/.device/svcload/service_store_bench.sh" 15 >"$log/r2_table.txt" 2>&1
echo "r2 rc $?" >>"$log/r2_table.txt"
tail -n 9 "$log/r2_table.txt"
prompt=$(printf 'the %.0s' $(seq 1 128))
timeout 60 bin/moe-generate --backend=cuda --model=/tmp/moe_serve_store --prompt="$prompt" \
  --max_tokens=256 --ignore_eos --temperature=0 >"$log/d1_generate.txt" 2>&1
echo "d1 rc $?" >>"$log/d1_generate.txt"
grep -E "budgets|decode|rc" "$log/d1_generate.txt"
rm -rf /tmp/moe_serve_store
timeout 170 bin/moe-bench --context=256 --batches=1,128 --batch_steps=16 --prompt= --timings \
  --store_dir=/tmp/svc_bench_store --store_vram_percents=100 --store_batches=1,128 \
  --store_steps=32 >"$log/d2_moe_bench_store.txt" 2>&1
echo "d2 rc $?" >>"$log/d2_moe_bench_store.txt"
grep -E "^(1|128) |decode tokens/s|graph|replayed|^ *100%|rc" "$log/d2_moe_bench_store.txt" | head -20
rm -rf /tmp/svc_bench_store /tmp/moe_bench_model
tar czf "$OUT/service_stop41/logs.tgz" -C "$log" .
cp "$log/r2_table.txt" "$OUT/service_stop41/"
