#!/usr/bin/env bash
# GPU run 70, first call (~9.5 min; build the wheel first): the whole GPU suite's two halves and the
# stride fuzz at once on one card, on stop 46's last code (launch scratch on every front end, a paged
# call's query lengths by the table copy's kernel, fills and copies merged per region, scratch laid
# out by prepare). One all.tgz back.
set -u
PART=suite1 bash ci/gpu_suite.sh > "$OUT/suite1.out" 2>&1 &
PART=suite2 bash ci/gpu_suite.sh > "$OUT/suite2.out" 2>&1 &
PART=fuzz FUZZ_LIMIT=540 FUZZ_VALID=3000 bash ci/gpu_suite.sh > "$OUT/fuzz.out" 2>&1 &
wait
cat "$OUT"/suite1.out "$OUT"/suite2.out "$OUT"/fuzz.out
cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz && find . -type f ! -name all.tgz -delete
