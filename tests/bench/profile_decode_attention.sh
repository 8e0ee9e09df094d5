#!/usr/bin/env bash
# Where the decode attention's time goes, on the GPU machine with bundle/ carried along:
#   tests/bench/profile_decode_attention.sh OUT_DIR [formats]
# 1. per-kernel device time of the KV write, decode attention and combine at 32k, batch 1;
# 2. ncu's full section set (stall reasons, instruction mix, per-SASS-line samples) on one
#    TurboQuant-4 decode attention;
# 3. the SASS of the decode attention kernels (cuobjdump), to count instructions a tile.
set -uo pipefail
out=${1:?usage: profile_decode_attention.sh OUT_DIR [formats]}
formats=${2:-bf16,fp8_e4m3,tq4,tq2}
mkdir -p "$out"
bin=$PWD/bundle/bin
bench=("$bin/moe-bench" --kv_only --layers=2 --model_dir=/tmp/profile_model --kv_contexts=32768
  --kv_batches=1 --kv_steps=1)
ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  -k regex:'Attention|Tq|Combine|PagedKv' "${bench[@]}" --kv_formats="$formats" \
  >"$out/times.csv" 2>"$out/times.err"
# Per kernel (template arguments kept): the median device time in microseconds (the median
# skips the two 32k-token writes that fill the cache).
python3 - "$out/times.csv" >"$out/times.txt" <<'PY'
import csv, re, statistics, sys
times, source = {}, ""
for row in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')):
    if len(row) > 14 and row[12] == "gpu__time_duration.sum":
        name = re.sub(r"\((unnamed>::)?(PagedGeom|AttnParams).*", "", row[4])
        name = name.replace("void ", "").replace("unnamed>::", "")
        if "DecodeAttentionKernel" in name:
            source = name[name.index(",", name.index(",") + 1) + 2:-1]
        elif "Combine" in name:
            name += " after " + source  # the combine of the decode kernel before it
        times.setdefault(name, []).append(float(row[14].replace(",", "")) / 1000)
for name in sorted(times):
    print(f"{name:64s} {statistics.median(times[name]):8.2f} us (median of {len(times[name])})")
PY
ncu --clock-control none --set full --import-source no -k regex:DecodeAttention \
  -c 1 -o "$out/tq4" "${bench[@]}" --kv_formats=tq4 >"$out/ncu_full.log" 2>&1
ncu --import "$out/tq4.ncu-rep" --page details >"$out/details.txt" 2>&1
ncu --import "$out/tq4.ncu-rep" --page source --csv --print-source sass -k regex:DecodeAttention \
  >"$out/source_sass.csv" 2>&1
cuobjdump -sass "$PWD/bundle/lib/libmoe_kernels.so" |
  awk '/Function : .*DecodeAttention/ { on = 1 } /Function : / && !/DecodeAttention/ { on = 0 } on' \
  >"$out/sass.txt"
rm -f "$out/tq4.ncu-rep"
gzip -f "$out/source_sass.csv" "$out/sass.txt"
ls -la "$out"
