#!/usr/bin/env bash
# GPU run 67, command 4, short form (~1.5 min, for the last device minutes; wheel of d94ff83's C++):
# the by-tokens and paged tests at the 2-4 (one sequence: 2-8) limit, and memcheck over the former.
set -u
PART=files LIMIT=70 FILES="test_decode_by_tokens.py test_paged.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3
