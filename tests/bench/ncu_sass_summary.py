#!/usr/bin/env python3
"""Where a kernel's warps wait, by instruction: a summary of ncu's source page.

Input: the CSV that `ncu -i REPORT --page source --print-source sass --csv` prints for a report
collected with `--section SourceCounters` (tests/gpu_results/stop45/go1.sh makes one). For each
kernel in it: the executed warp instructions and stall samples, the stall reasons' shares, the
opcode mix (share of executed instructions and of stall samples), and the instructions with the
most samples, so that a kernel's loop can be read without a disassembler on the build machine.

Usage: ncu_sass_summary.py SOURCE.csv [--top N]
"""
import argparse
import collections
import csv
import re


def kernels(path):
    """Yields (name, header, rows) for each kernel section of the CSV."""
    name, header, rows = None, None, []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                if header is not None:
                    yield name, header, rows
                name, header, rows = row[1], None, []
            elif name is not None and header is None:
                header = row
            elif header is not None:
                rows.append(row)
    if header is not None:
        yield name, header, rows


def opcode(source):
    """The opcode of a SASS line, its predicate dropped: '@!P1 LDG.E.64 R2, ...' -> 'LDG.E.64'."""
    parts = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split()
    return parts[0] if parts else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=12, help="hottest instructions to list")
    args = parser.parse_args()
    for name, header, rows in kernels(args.csv):
        col = {h: i for i, h in enumerate(header)}
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

        def num(row, key):
            value = row[col[key]] if key in col else ""
            return int(value) if value.strip() else 0

        executed = collections.Counter()
        sampled = collections.Counter()
        by_reason = collections.Counter()
        for row in rows:
            op = opcode(row[col["Source"]])
            executed[op] += num(row, "Instructions Executed")
            sampled[op] += num(row, "Warp Stall Sampling (All Samples)")
            for reason in reasons:
                by_reason[reason] += num(row, reason)
        total_exec = max(1, sum(executed.values()))
        total_samples = max(1, sum(sampled.values()))
        print(f"== {name[:160]}")
        print(f"   warp instructions {sum(executed.values())}, "
              f"stall samples {sum(sampled.values())}")
        print("   stall reasons (share of samples):")
        for reason, value in by_reason.most_common(8):
            print(f"     {reason:26s} {100 * value / total_samples:5.1f}%")
        print("   opcodes (share of executed instructions, of samples):")
        for op, value in executed.most_common(20):
            share_exec, share_samples = 100 * value / total_exec, 100 * sampled[op] / total_samples
            print(f"     {op:24s} {share_exec:5.1f}%  {share_samples:5.1f}%")
        print(f"   the {args.top} instructions with the most samples (address, executed, samples):")
        hottest = sorted(rows, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))
        for row in hottest[: args.top]:
            samples = num(row, "Warp Stall Sampling (All Samples)")
            print(f"     {row[col['Address']][-6:]} {num(row, 'Instructions Executed'):9d} "
                  f"{samples:6d}  {row[col['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
