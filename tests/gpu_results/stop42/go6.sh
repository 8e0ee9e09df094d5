#!/bin/bash
tar xzf .device/b/bundle.tgz -C /tmp; bin=/tmp/bundle/bin
timeout 33 $bin/parity_test --gtest_filter='*QuantMatMulParity*:*QuantExpertFfnParity*' > $OUT/parity_q.txt 2>&1; echo "parity rc=$?" >> $OUT/parity_q.txt
grep -c "OK \]" $OUT/parity_q.txt; grep -h "rc=\|PASSED\|FAILED\|tests from.*ran" $OUT/parity_q.txt | tail -8
