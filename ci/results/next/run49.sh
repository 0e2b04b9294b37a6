# GPU run 49 (prepared 2026-12-04): bench_transformers.py without the per-step sync of its loss
# (label -100 instead of boolean indexing), then the collator-kwargs GPU test. Wheel of run 47.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
timeout 100 python3 $repo/benchmarks/bench_transformers.py --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc $?"; grep -v '^{' $OUT/bench/transformers.md 2>/dev/null || grep '^{' $OUT/bench.log | cut -c1-200
timeout 40 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py -k collator > $OUT/collator.log 2>&1
echo "collator rc $?"; tail -1 $OUT/collator.log; grep -E "^E  " $OUT/collator.log | head -5
