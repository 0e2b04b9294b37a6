#!/usr/bin/env bash
# GPU run 64, command 3: the host benchmark (issue 31 item 7, with the Python-node diagnostic) and
# bench_call_patterns three times (issue 32 item 3).
set -u
PART=host bash ci/gpu_bench.sh
(cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); ls $OUT
