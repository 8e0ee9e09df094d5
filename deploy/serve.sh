#!/usr/bin/env bash
# The first README command: installs what is missing, builds, starts the service on the built-in
# default model (one moe-worker behind moe-frontend on 127.0.0.1:50051), shows a client talking
# to it, and keeps serving until Ctrl-C (which drains both processes).
# Arguments are passed to moe-client (e.g. --user='Hello').
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
# The same configuration as tests/run.sh, so the two commands share one build.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOE_WERROR=ON >/dev/null
cmake --build build -j "$(nproc)" --target moe-worker moe-frontend moe-client

build/bin/moe-worker --model=models/default --listen=127.0.0.1:50061 \
  --metrics_listen=127.0.0.1:9461 &
worker=$!
build/bin/moe-frontend --workers=127.0.0.1:50061 --listen=127.0.0.1:50051 \
  --metrics_listen=127.0.0.1:9451 &
frontend=$!
trap 'kill -TERM $frontend $worker 2>/dev/null; wait' INT TERM EXIT

# Ready when the frontend lists the model (the worker writes it on first use).
for _ in $(seq 1 300); do
  build/bin/moe-client --list_models 2>/dev/null | grep -q . && break
  sleep 0.2
done
build/bin/moe-client --list_models
[ $# -gt 0 ] || set -- --user='Who are you?' --temperature=0  # the built-in model's own answer
build/bin/moe-client --max_tokens=48 "$@"
echo "serving moe.v1 on 127.0.0.1:50051 (metrics :9451, :9461); try build/bin/moe-client --user='Hi'; Ctrl-C stops"
wait
