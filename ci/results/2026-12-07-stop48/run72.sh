#!/usr/bin/env bash
# GPU run 72 (~9.5 min; build the wheel first): the whole GPU suite in three parts and the stride fuzz at
# once on one card, on the code with the prefix + tail split on by default (run 71 verified it). One
# all.tgz back.
set -u
PART=suite1 bash ci/gpu_suite.sh > "$OUT/suite1.out" 2>&1 &
PART=suite2 bash ci/gpu_suite.sh > "$OUT/suite2.out" 2>&1 &
PART=suite3 bash ci/gpu_suite.sh > "$OUT/suite3.out" 2>&1 &
PART=fuzz FUZZ_LIMIT=540 FUZZ_VALID=3000 bash ci/gpu_suite.sh > "$OUT/fuzz.out" 2>&1 &
wait
cat "$OUT"/suite1.out "$OUT"/suite2.out "$OUT"/suite3.out "$OUT"/fuzz.out | grep -vE "^\s*$" | tail -60
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz && find . -type f ! -name all.tgz -delete
