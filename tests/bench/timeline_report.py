#!/usr/bin/env python3
"""Where a decode step's GPU time goes, from a kernel_timeline.cc CSV (the GPU's own timeline,
launches overlapped as in production).

  timeline_report.py TIMELINE.csv [--marker SampleKernel] [--skip 8] [--last N]

Steps end at each kernel whose name holds --marker. Steps with the kernel count whose kernels
run longest in all are kept (the decode steps of one shape), the first --skip of them dropped;
with --last, the last N steps whatever their kernels (runs whose steps differ, as the expert
store's). Memory copies are listed apart (count and time a step) and hold nothing.
Each instant of a step is given to the oldest kernel still running (a kernel launched early by
programmatic dependent launch waits for its predecessor: the predecessor is the one working), or
to `idle` when none runs.
Printed per kernel: launches a step, mean start-to-end time, and the median time a step it holds
the GPU; the step's median wall time last.
"""
import argparse
import collections
import csv
import heapq
import re
import statistics


def short_name(name):
    name = name.replace("(anonymous namespace)::", "").replace("moe::kernels::cuda::", "")
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i in range(len(name) - 1, -1, -1):  # drop the trailing parameter list
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] if name.endswith(")") else name
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--marker", default="SampleKernel")
    ap.add_argument("--skip", type=int, default=8)
    ap.add_argument("--last", type=int, default=0)
    args = ap.parse_args()

    rows, copies = [], []
    with open(args.csv) as f:
        for r in csv.DictReader(f):
            row = (int(r["start_ns"]), int(r["end_ns"]), short_name(r["name"]))
            (copies if row[2].startswith("memcpy") else rows).append(row)
    rows.sort()
    steps, current = [], []
    for row in rows:
        current.append(row)
        if args.marker in row[2]:
            steps.append(current)
            current = []
    if not steps:
        raise SystemExit(f"no kernel named *{args.marker}* in {args.csv}")
    time_by_count = collections.Counter()
    for s in steps:
        time_by_count[len(s)] += sum(r[1] - r[0] for r in s)
    mode = time_by_count.most_common(1)[0][0]  # the shape that holds the GPU longest
    if args.last > 0:
        steps = steps[-args.last:]
    else:
        steps = [s for s in steps if len(s) == mode][args.skip:]
    if not steps:
        raise SystemExit("no steps left after --skip")

    # Per step: exposed time of each kernel name (oldest running kernel holds the instant).
    exposed = collections.defaultdict(list)
    launches = collections.Counter()
    durations = collections.defaultdict(list)
    walls = []
    prev_end = None
    for s in steps:
        begin = s[0][0] if prev_end is None else prev_end
        end = s[-1][1]
        prev_end = end
        walls.append(end - begin)
        held = collections.Counter()
        points = sorted({begin, end} | {max(begin, min(end, t)) for r in s for t in r[:2]})
        active, nxt = [], 0  # heap of running kernels by start; s is sorted by start
        for a, b in zip(points, points[1:]):
            while nxt < len(s) and s[nxt][0] <= a:
                heapq.heappush(active, s[nxt])
                nxt += 1
            while active and active[0][1] <= a:
                heapq.heappop(active)  # ended; a kernel ending later but older stays on top
            running = [r for r in active if r[1] >= b]
            held[min(running)[2] if running else "idle"] += b - a
        for name in set(r[2] for r in s) | {"idle"}:
            exposed[name].append(held[name])
        for r in s:
            launches[r[2]] += 1
            durations[r[2]].append(r[1] - r[0])

    n = len(steps)
    wall = statistics.median(walls)
    counts = sorted({len(s) for s in steps})
    shape = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    print(f"{n} steps of {shape} kernels; median step {wall / 1e3:.1f} us")
    window = (steps[0][0][0], steps[-1][-1][1])
    kinds = collections.defaultdict(lambda: [0, 0, 0])  # copies in the steps: count, ns, bytes
    for a, b, name in copies:
        if window[0] <= a < window[1]:
            k = kinds[name.split()[1]]
            k[0], k[1], k[2] = k[0] + 1, k[1] + b - a, k[2] + int(name.split()[2])
    for kind, (count, ns, nbytes) in sorted(kinds.items()):
        print(f"copies {kind}: {count / n:.1f} a step, {ns / n / 1e3:.1f} us a step, "
              f"{nbytes / n / 1e6:.2f} MB a step ({nbytes / max(ns, 1):.1f} GB/s while copying)")
    print(f"{'held us/step':>12} {'share':>6} {'launches':>8} {'mean us':>8}  kernel")
    order = sorted(exposed, key=lambda k: -statistics.median(exposed[k]))
    for name in order:
        held = statistics.median(exposed[name])
        mean = statistics.mean(durations[name]) / 1e3 if durations[name] else 0.0
        print(f"{held / 1e3:12.1f} {held / wall:6.1%} {launches[name] / n:8.0f} {mean:8.2f}  "
              f"{name[:100]}")


if __name__ == "__main__":
    main()
