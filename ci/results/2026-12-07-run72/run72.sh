#!/usr/bin/env bash
# GPU run 72 (~9 min; build the wheel first): the whole GPU suite in three parts and the stride fuzz at
# once on one card, on the code with the prefix + tail split on by default (run 71 verified it; its
# rule from probe71). Limits for a short device budget: each part 470 s (run 70's halves took 515-560,
# so the parts' last files may be cut: the logs say where). At most 8 files back: no per-part .out.
set -u
export SUITE_LIMIT=${SUITE_LIMIT:-470}
for part in suite1 suite2 suite3; do PART=$part bash ci/gpu_suite.sh >> "$OUT/parts.out" 2>&1 & done
PART=fuzz FUZZ_LIMIT=440 FUZZ_VALID=3000 bash ci/gpu_suite.sh >> "$OUT/parts.out" 2>&1 &
wait
cat "$OUT/parts.out"; ls "$OUT"
