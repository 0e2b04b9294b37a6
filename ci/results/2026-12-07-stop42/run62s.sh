#!/usr/bin/env bash
# GPU run 62 (last device minutes): decoding by heads' GPU tests, then the decode-length benchmark if time is left.
set -u
PART=files LIMIT=110 FILES="test_decode_graphs.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 55 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14; tail -3 $OUT/decode.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
