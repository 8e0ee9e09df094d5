#!/bin/bash
# Device command (quantb): bash .device/quantb/run.sh, from the repo root.
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
rm -rf /tmp/fx && mkdir -p /tmp/fx && cp -r ../../tests/golden/fixtures/qwen3_moe_fp8 /tmp/fx/
timeout 300 python3 driver.py /tmp/fx/qwen3_moe_fp8 2>&1 | tee $OUT/log.txt
ls -la $OUT
