#!/bin/bash
# usage: MOE_CPU_REVERSE_SUMS_ABOVE=N tests/gpu_results/quantb/cpu_reverse_sums.sh LABEL (after ninja -C build-cpu -j1 golden_test); the full log in /tmp/quantb_LABEL.log
cd "$(git rev-parse --show-toplevel)"
F=""
for i in 10 12 13 14 15; do F="$F:Architectures/GoldenTest.BatchOf24MatchesEachAlone/$i"; done
F="$F:Architectures/GoldenTest.BatchedStepMatchesSingle/10:Architectures/GoldenTest.BatchedStepMatchesSingle/14:Architectures/GoldenTest.BatchedStepMatchesSingle/15"
./build-cpu/tests/golden/golden_test --gtest_filter="${F#:}" > /tmp/quantb_$1.log 2>&1
grep -E "batch of|Which is|Expected|actual|greedy [0-9]|OK \]|FAILED \]|MaxRel|both|batched step" /tmp/quantb_$1.log
