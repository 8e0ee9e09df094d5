#!/bin/bash
# Routing traces of the trained default model on held-out text it never trained on, beside the
# random-weight test model's on the same text, replayed by moe-store-sim (every policy against
# Belady's MIN at 1/8, 1/4 and 1/2 of the experts).
#   tests/default_model/record_traces.sh HELDOUT.txt [OUT]   (env BIN: default build-cpu/bin)
# HELDOUT.txt: prepare.py's heldout.txt. The prompt (the first TEXT_BYTES of it) is prefilled one
# token a step (--max_batch_tokens=1), so the trace holds every held-out token's routing,
# teacher-forced, with the prefetch predictions (--prefetch) riding in it.
set -euo pipefail
heldout=$1
out=${2:-/tmp/moe_default_traces}
bin=$(realpath "${BIN:-build-cpu/bin}")
tools=$(realpath "${TOOLS:-build-cpu/tests/integration}")  # moe_offline_tokens
bytes=${TEXT_BYTES:-7400}  # ~1,800 tokens of the trained model (context 2,048), ~4,000 of the random one (4,096)
mkdir -p "$out"
text=$(head -c "$bytes" "$heldout")
text=${text% *}  # end on a whole word

# The trained model as moe-generate writes it on first use (models/default), the random one as
# the tests write it.
rm -rf "$out/models" && (cd "$out" && "$bin/moe-generate" --max_tokens=1 >/dev/null 2>&1)
rm -rf "$out/trained_dir" && mv "$out/models/default" "$out/trained_dir"
"$tools/moe_offline_tokens" --write_default_model="$out/random_dir"
for m in trained random; do
  rm -rf "$out/${m}_store"
  "$bin/moe-import" --model_dir="$out/${m}_dir" --store_dir="$out/${m}_store" --format=bf16 \
    >"$out/${m}_import.log" 2>&1
  "$bin/moe-generate" --model="$out/${m}_store" --device_budget=1MiB --prefetch \
    --record_trace="$out/$m.trace" --max_batch_tokens=1 --temperature=0 --max_tokens=1 \
    --prompt="$text" >/dev/null 2>"$out/${m}_generate.log"
  echo "== $m"
  grep '\[store\]' "$out/${m}_generate.log" || true
  "$bin/moe-store-sim" --trace="$out/$m.trace" --budgets=12.5,25,50
done
