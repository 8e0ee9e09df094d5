# Sourced by the GPU machine's scripts (tests/gpu_suite.sh, tests/bench/batched_moe.sh), with
# $out set: records the GPU in $out/gpu.txt, then `run NAME TIMEOUT CMD...` logs a step to
# $out/NAME.txt and adds its status line to `status` (printed by the script at its end).
bin=$PWD/bundle/bin
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } |
  tee "$out/gpu.txt"
status=()
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  local rc=$?
  status+=("$(printf '%-16s rc=%-3d %4ds' "$name" "$rc" $((SECONDS - t0)))")
}
