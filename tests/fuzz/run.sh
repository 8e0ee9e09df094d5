#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, CPU only) in their own build directory,
# replays each committed corpus, then fuzzes each target for a bounded time.
# Usage: tests/fuzz/run.sh [--seconds=N] [--jobs=J] [TARGET...]
#   --seconds=N  fuzzing time per target (default: 60 s over all targets, the CI smoke)
#   TARGET       only these targets (default: all)
# Environment: MOE_FUZZ_BUILD_DIR (default build-fuzz). New inputs that reach new coverage go
# to $MOE_FUZZ_BUILD_DIR/corpus/<target>/ (not committed); crashes to
# $MOE_FUZZ_BUILD_DIR/artifacts/<target>/ and the script fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets_all=(fuzz_safetensors fuzz_blob fuzz_model_config fuzz_tokenizer_json
             fuzz_tokenizer_encode fuzz_chat_template fuzz_generate_request)
seconds=""
jobs=$(nproc)
targets=()
for a in "$@"; do
  case "$a" in
    --seconds=*) seconds=${a#*=} ;;
    --jobs=*) jobs=${a#*=} ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) targets+=("$a") ;;
  esac
done
[ ${#targets[@]} -eq 0 ] && targets=("${targets_all[@]}")
[ -z "$seconds" ] && seconds=$(( (60 + ${#targets[@]} - 1) / ${#targets[@]} ))

build_dir=${MOE_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMOE_FUZZ=ON -DMOE_WITH_CUDA=OFF \
  >/dev/null
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in "${targets[@]}"; do
  seeds=tests/fuzz/corpus/$t
  work="$build_dir/corpus/$t"
  artifacts="$build_dir/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  log="$build_dir/$t.log"
  # The seeds are read, never written: new inputs land in $work.
  if "$build_dir/tests/fuzz/$t" "$work" "$seeds" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
       -max_len=65536 -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    echo "$t: ok, $execs executions in ${seconds}s"
  else
    echo "$t: FAILED (log: $log, inputs: $artifacts)"
    tail -40 "$log"
    status=1
  fi
done
exit $status
