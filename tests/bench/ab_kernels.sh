#!/usr/bin/env bash
# A/B of the CUDA kernels library on the GPU machine, same binaries, same run: the bundle as built
# ("new") against the bundle with an earlier libmoe_kernels.so ("base", xz-compressed in the
# git-ignored build-alt/: `xz -c build-bundle/kernels/libmoe_kernels.so > build-alt/base.so.xz`
# before rebuilding). From the repository root with bundle/ and build-alt/ carried along:
#   tests/bench/ab_kernels.sh OUT_DIR BASE_XZ ROUNDS [moe-bench flags...]
# Runs matvec_bench once per variant, then ROUNDS interleaved moe-bench runs (base, new, base,
# ...) on one generated model, and prints the decode and throughput lines of each (and the KV
# sweep's rows, for --kv_only runs).
set -uo pipefail
out=${1:?usage: ab_kernels.sh OUT_DIR BASE_XZ ROUNDS [moe-bench flags...]}
base_xz=${2:?base library (.so.xz)}
rounds=${3:?rounds}
shift 3
work=/tmp/ab_kernels
rm -rf "$work"
mkdir -p "$work/new" "$work/base" "$out"
cp -r bundle/. "$work/new/"
cp -r bundle/. "$work/base/"
xz -dc "$base_xz" >"$work/base/lib/libmoe_kernels.so"
model=$work/model
"$work/new/bin/moe-bench" --model_dir="$model" --batches=1 --steps=8 --prompt=16 --store_dir= \
  >"$out/generate.txt" 2>&1 || { tail "$out/generate.txt"; exit 1; }
if [[ -x bundle/bin/matvec_bench ]]; then
  for v in base new; do "$work/$v/bin/matvec_bench" >"$out/matvec_$v.txt" 2>&1; done
fi
for r in $(seq "$rounds"); do
  for v in base new; do
    "$work/$v/bin/moe-bench" --model_dir="$model" "$@" >"$out/bench_${v}_$r.txt" 2>&1
    grep -E 'decode tokens/s|throughput tokens/s|decode, batch 1, host|^(bf16|fp8|tq)' \
      "$out/bench_${v}_$r.txt" |
      sed "s/^/$v $r /"
  done
done
