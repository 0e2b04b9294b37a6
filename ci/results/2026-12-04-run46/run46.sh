# GPU run 46 (prepared 2026-12-04): the transformers integration's GPU tests (first run), then its
# benchmark. Wheel of 35592f0; this commit's Python files copied over it (Python-only changes).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
timeout ${TEST_TIMEOUT:-420} python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py ${TEST_ARGS:-} \
  > $OUT/transformers_tests.log 2>&1
echo "tests rc $?"; tail -1 $OUT/transformers_tests.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/transformers_tests.log | cut -c1-300 | head -30
