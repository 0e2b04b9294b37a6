set -u
repo=$(pwd)
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
ls /tmp/sfa/stridedfa >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
mkdir -p /tmp/w && cd /tmp/w
timeout 100 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py -k gpt_oss > $OUT/gpt_oss_tests.log 2>&1
echo "gpt_oss tests rc $?"; tail -1 $OUT/gpt_oss_tests.log; grep -E "^E  " $OUT/gpt_oss_tests.log | head -5
timeout 420 python3 $repo/benchmarks/bench_transformers.py --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc $?"; tail -25 $OUT/bench.log
