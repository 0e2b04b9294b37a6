#!/usr/bin/env bash
# GPU run 66, command 2 (issue 33 item 5): compute-sanitizer memcheck over the split-KV tests, the
# paged view by heads and the unmasked one-query steps (the launch's made tables, lengths, merges).
set -u
site=/tmp/sfa-mc; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl
cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 420 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -x -o cache_dir=/tmp/.c test_split_kv.py \
  "test_decode_graphs.py::test_one_query_through_a_paged_view_matches_the_reference" \
  "test_decode_graphs.py::test_one_query_planned_unmasked_matches_the_reference" > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -4
(cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz)
