#!/usr/bin/env python3
"""The host->device copies of a kernel timeline (kernel_timeline.cc with MOE_TIMELINE_COPIES=1)
against its decode steps: per step (ended by the sampling kernel), how many expert-sized copies
started in it, when the first started and when the median and the last ended relative to the
step's start (a step's last copy is often the next step's first: the store queues the loads a
step missed before its sampling kernel ends); then the copies' durations over all steps.
Usage: timeline_copies.py TIMELINE.csv [--min_bytes N] (default 1 MB: the expert store's loads,
not the routing's small copies) [--marker NAME] (the kernel that ends a step)."""
import argparse
import csv
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv")
    ap.add_argument("--min_bytes", type=int, default=1 << 20)
    ap.add_argument("--marker", default="SampleKernel")
    args = ap.parse_args()
    ends, copies = [], []
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            start, end, name = int(r["start_ns"]), int(r["end_ns"]), r["name"]
            if args.marker in name:
                ends.append(end)
            elif name.startswith("memcpy HtoD ") and int(name.split()[2]) >= args.min_bytes:
                copies.append((start, end))
    ends.sort()
    copies.sort()
    print("step     ms copies  first start ms  median end ms  last end ms  (from the step's start)")
    durations = []
    for i in range(1, len(ends)):
        t0, t1 = ends[i - 1], ends[i]
        mine = [c for c in copies if t0 <= c[0] < t1]
        durations += [(c[1] - c[0]) / 1e3 for c in mine]
        if mine:
            print(f"{i:4d} {(t1 - t0) / 1e6:6.2f} {len(mine):6d} {(mine[0][0] - t0) / 1e6:15.2f}"
                  f" {(statistics.median(c[1] for c in mine) - t0) / 1e6:14.2f}"
                  f" {(max(c[1] for c in mine) - t0) / 1e6:12.2f}")
        else:
            print(f"{i:4d} {(t1 - t0) / 1e6:6.2f} {0:6d}")
    if durations:
        print(f"{len(durations)} copies: median {statistics.median(durations):.1f} us, "
              f"max {max(durations):.1f} us")


if __name__ == "__main__":
    main()
