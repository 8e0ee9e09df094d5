#!/usr/bin/env bash
# Device call 2 of the fp8 branch: fixture qwen3_moe_fp8 (again: call 1 lost its weights file to
# the 8-file limit), golden on CUDA, parity, moe-bench rows. At most 7 files into $OUT/r.
set -u
R=$OUT/r; mkdir -p $R
D=$(pwd)/.device/fp8
tar xzf $D/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
F=$R/fixture.log
nvidia-smi --query-gpu=name,memory.total --format=csv > $F 2>&1
FX=/tmp/fx; mkdir -p $FX; cp -r tests/golden/fixtures/* $FX/; cp -r $D/qwen3_moe_ct_fp8 $FX/
rm -rf $FX/qwen3_moe_fp8
( time timeout 50 python3 $D/make_fixtures.py --out $FX --only qwen3_moe_fp8 ) >> $F 2>&1
diff $FX/qwen3_moe_fp8/expected.json $D/expected_call1.json >> $F 2>&1; echo "expected.json diff vs call 1: rc $?" >> $F
tar czf $R/fx_fp8.tgz -C $FX qwen3_moe_fp8
mkdir -p /work/wt-fp8/tests/golden && ln -sfn $FX /work/wt-fp8/tests/golden/fixtures
( time timeout 40 $bin/golden_gpu_test --gtest_filter='*/14:*/15:PublishedF8*' ) > $R/golden_gpu.log 2>&1
( time timeout 40 $bin/golden_store_gpu_test --gtest_filter='PublishedQuant*:QuantizedDense*Fp8*' ) > $R/golden_store_gpu.log 2>&1
( time timeout 60 $bin/parity_test --gtest_filter='*QuantMatMul*:*QuantExpertFfn*' ) > $R/parity.log 2>&1
B="--store_dir= --decode_contexts=512,4096 --prompt=512 --batches=8 --batch_steps=4"
( time timeout 60 $bin/moe-bench $B --model_dir=/tmp/mb_fp8 --dense_format=fp8 --expert_format=fp8 --group=128 ) > $R/bench_fp8.log 2>&1
( time timeout 50 $bin/moe-bench $B --model_dir=/tmp/mb_bf16 --dense_format=bf16 ) > $R/bench_base.log 2>&1
( time timeout 50 $bin/moe-bench $B --model_dir=/tmp/mb_int8 --dense_format=int8 --expert_format=int8 --group=128 ) >> $R/bench_base.log 2>&1
tail -3 $R/*.log
