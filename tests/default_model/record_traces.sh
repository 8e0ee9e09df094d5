#!/bin/bash
# Routing traces of the trained default model on held-out text it never trained on, beside the
# random-weight test model's on the same text, replayed by moe-store-sim (every policy against
# Belady's MIN at 1/8, 1/4 and 1/2 of the experts).
#   tests/default_model/record_traces.sh HELDOUT.txt [OUT]   (env BIN: default build-cpu/bin)
# HELDOUT.txt: prepare.py's heldout.txt. Three windows of it (TEXT_BYTES each, from three places)
# are each prefilled one token a step (--max_batch_tokens=1), so the trace holds every held-out
# token's routing, teacher-forced, with the prefetch predictions (--prefetch) riding in it; the
# three runs' traces are joined, their steps renumbered to follow one another.
set -euo pipefail
heldout=$1
out=${2:-/tmp/moe_default_traces}
bin=$(realpath "${BIN:-build-cpu/bin}")
tools=$(realpath "${TOOLS:-build-cpu/tests/integration}")  # moe_offline_tokens
bytes=${TEXT_BYTES:-7400}  # ~1,800 tokens of the trained model (context 2,048), ~4,000 of the random one (4,096)
mkdir -p "$out"
size=$(stat -c %s "$heldout")
window() {  # window K: TEXT_BYTES from K/3 of the file, starting and ending on whole words
  local t
  t=$(tail -c +$((size * $1 / 3 + 1)) "$heldout" | head -c "$bytes")
  t=${t#* }
  echo "${t% *}"
}

# The trained model as moe-generate writes it on first use (models/default), the random one as
# the tests write it.
rm -rf "$out/models" && (cd "$out" && "$bin/moe-generate" --max_tokens=1 >/dev/null 2>&1)
rm -rf "$out/trained_dir" && mv "$out/models/default" "$out/trained_dir"
"$tools/moe_offline_tokens" --write_default_model="$out/random_dir"
for m in trained random; do
  rm -rf "$out/${m}_store"
  "$bin/moe-import" --model_dir="$out/${m}_dir" --store_dir="$out/${m}_store" --format=bf16 \
    >"$out/${m}_import.log" 2>&1
  echo "== $m"
  for k in 0 1 2; do
    "$bin/moe-generate" --model="$out/${m}_store" --device_budget=1MiB --prefetch \
      --record_trace="$out/$m.$k.trace" --max_batch_tokens=1 --temperature=0 --max_tokens=1 \
      --prompt="$(window $k)" >/dev/null 2>"$out/${m}_generate.$k.log"
    grep '\[store\]' "$out/${m}_generate.$k.log" || true
  done
  # Join: one header; each run's steps shifted past the previous run's last.
  awk 'FNR == 1 { base = last + 1; if (NR == 1) print; next }
       $1 == "p" { $2 += base; if ($2 > last) last = $2; print; next }
       { $1 += base; if ($1 > last) last = $1; print }' \
    "$out/$m.0.trace" "$out/$m.1.trace" "$out/$m.2.trace" >"$out/$m.trace"
  "$bin/moe-store-sim" --trace="$out/$m.trace" --budgets=12.5,25,50
done
