#!/usr/bin/env bash
# kvtailcuda device run: parity (paged + tail), golden_gpu, moe-bench KV sweep with and without a
# 16-bit tail, kv-quality on CUDA, then the full parity suite with what time is left.
set -u
start=$(date +%s)
left() { echo $(( ${BUDGET:-400} - ($(date +%s) - start) )); }
tar xzf .device/kvtailcuda/bundle.tgz -C /tmp
bin=/tmp/bundle/bin
# The binaries look for fixtures under the build's source dir.
if [ ! -e /work/wt-kvtailcuda ]; then mkdir -p /work && ln -s "$PWD" /work/wt-kvtailcuda; fi
o=$OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $o/gpu.txt
echo "repo: $PWD" >> $o/gpu.txt
run() {  # name seconds cmd...
  local name=$1 t=$2; shift 2
  local l; l=$(left); [ "$t" -gt "$l" ] && t=$l
  if [ "$t" -le 5 ]; then echo "$name skipped (no time)" >> $o/summary.txt; return; fi
  local s=$(date +%s)
  timeout "$t" "$@" > $o/$name.txt 2>&1
  echo "$name rc=$? ${t}s-limit took $(( $(date +%s) - s ))s" >> $o/summary.txt
}
run parity_paged 120 $bin/parity_test --gtest_filter='*Paged*'
run golden_gpu 60 $bin/golden_gpu_test
for w in 0 64; do
  run moe_bench_kv_tail$w 90 $bin/moe-bench --kv_only --model_dir=/tmp/m --kv_formats=fp8_e4m3,tq4 \
    --kv_contexts=512 --kv_batches=1,64 --kv_steps=16 --kv_repeats=3 --kv_tail_tokens=$w
done
run parity_full 200 $bin/parity_test
run kv_quality_cuda_tail16 60 $bin/kv-quality --backend cuda --tail 16
tail -3 $o/parity_paged.txt $o/golden_gpu.txt $o/parity_full.txt 2>/dev/null >> $o/summary.txt
cat $o/summary.txt
