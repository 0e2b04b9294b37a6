#!/usr/bin/env bash
# GPU run 61: the fill_empty_rows fix (several blocks per (b, h)) and the sync-free padding default.
set -u
PART=files FILES="test_empty_sequences.py test_varlen.py test_bias.py test_transformers.py test_zero_size.py" LIMIT=200 bash ci/gpu_suite.sh > $OUT/tests-summary.txt 2>&1 &
tests=$!
site=/tmp/sfa-bench; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
timeout 90 python3 benchmarks/profile_transformers_step.py --out $OUT/profile --padding right --models llama --hidden 1024 --steps 3 > $OUT/profile.log 2>&1; echo "profile rc $? (beside the tests)"; tail -22 $OUT/profile.log | cut -c1-200
wait $tests; cat $OUT/tests-summary.txt
timeout 130 python3 benchmarks/bench_transformers.py --out $OUT/bench-off --quick --hidden 1024 --models llama,bert --paddings none,ones,right,left > $OUT/bench-off.log 2>&1; echo "bench rc $?"; grep -E "^\||geomean|speedup" $OUT/bench-off.log | tail -12
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
