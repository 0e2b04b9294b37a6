# GPU run 55 (2026-12-05, stop 37): the gpt-oss generation failures of run 54 with a traceback and a
# per-call comparison (probe_gpt_oss.py), carrying .whl built from main at the time.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false STRIDEDFA_CACHE_DIR=$OUT/plans
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
timeout 200 python3 ci/results/2026-12-05-run55/probe_gpt_oss.py > $OUT/probe_gpt_oss.log 2>&1
echo "probe rc $?"; grep -v "^{" $OUT/probe_gpt_oss.log | cut -c1-400 | tail -40; grep -c BAD $OUT/probe_gpt_oss.log
grep BAD $OUT/probe_gpt_oss.log | cut -c1-400 | head -12
(cd tests/gpu && timeout ${TESTS_LIMIT:-200} python3 -m pytest -p no:cacheprovider -q -rfEs --tb=long \
  test_transformers.py -k gpt_oss -o cache_dir=/tmp/.c) > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.log; grep -E "^E  " $OUT/tests.log | cut -c1-300 | head -20
