#!/bin/bash
# Stop 44, call 7: each ZeroKernel and SampleKernel launch of profile_prefill.sh's run, with its
# grid and duration (ncu, serialised): which of them hold the ~0.56 ms and ~34 ms that run showed.
tar xJf .device/b/bundle.txz -C /tmp; ln -sfn /tmp/bundle bundle
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size --csv -k regex:'ZeroKernel|SampleKernel' \
  bundle/bin/moe-bench --layers=2 --model_dir=/tmp/profile_model --store_dir= \
  --batches= --context=16 --steps=1 --prompt=2048 > $OUT/launches.csv 2> $OUT/launches.err
python3 - $OUT/launches.csv > $OUT/launches.txt <<'PY'
import csv, sys, re
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi, ii = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value"), hdr.index("ID")
by = {}
for r in rows:
    by.setdefault(r[ii], {"k": re.sub(r"\(.*", "", r[ki])[-40:]})[r[mi]] = r[vi]
for i, d in by.items():
    print(i, d["k"], d.get("launch__grid_size"), d.get("gpu__time_duration.sum"))
PY
head -80 $OUT/launches.txt
