#!/bin/bash
# Device command 2 (quantb): bash .device/quantb/run2.sh, from the repo root.
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/log2.txt
python3 check_partial.py ../../tests/golden/fixtures/qwen3_moe_fp8 2>&1 | tee -a $OUT/log2.txt
timeout 240 python3 make_fixtures.py --out $OUT/fx --only qwen3_moe_fp8_b128 2>&1 | grep -v "Loading weights" | tee -a $OUT/log2.txt
ls -laR $OUT
