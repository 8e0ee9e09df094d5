#!/bin/bash
# The committed routing traces of the trained default model replay in moe-store-sim, and next_use
# keeps its lead over LRU and its share of MIN on them (NOTES: 24.8% vs 12.9% at 1/8 of the
# experts, 59% of MIN): fails if the policy or the trace format regresses.
#   replay_traces_test.sh MOE_STORE_SIM_BIN
set -euo pipefail
sim=$1
dir=$(dirname "$0")/traces
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gunzip -c "$dir/trained_heldout.trace.gz" >"$tmp/trained.trace"
"$sim" --trace="$tmp/trained.trace" --budgets=12.5 --policies=next_use,lru | tee "$tmp/out.txt"
# The row: "32 (12.5%)  24.80% ( 59%)  12.93% ( 31%)  42.14%  42.62%"
# Its percentages in order: budget, next_use, its share, lru, its share, MIN, MIN+bypass.
read -r _ next_use _ lru _ min _ <<<"$(grep '^32 (12.5%)' "$tmp/out.txt" | grep -o '[0-9.]*%' |
  tr -d '%' | tr '\n' ' ')"
echo "next_use $next_use% lru $lru% MIN $min%"
awk -v n="$next_use" -v l="$lru" -v m="$min" 'BEGIN {
  if (n == "" || l == "" || m == "") { print "no result row"; exit 1 }
  if (n < 1.5 * l) { print "next_use no longer 1.5x LRU"; exit 1 }
  if (n < 0.5 * m) { print "next_use under half of MIN"; exit 1 }
}'
