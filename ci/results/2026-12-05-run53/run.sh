# GPU run 53 (2026-12-05), one `run` command carrying .whl0 (main at 14a66e6, before issue 30) and
# .whl (with the empty-rows fill): issue 30's probe on both, then stop 29's unrun GPU tests and
# the GPU tests that cover the padded, varlen and paged paths, on the new wheel.
set -u
repo=$(pwd)
install() { rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa $1/*.whl; }
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/w && cd /tmp/w
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
if [ -d $repo/.whl0 ]; then
  install $repo/.whl0
  STRIDEDFA_CACHE_DIR=/tmp/plans-0 timeout 150 python3 -X faulthandler $repo/ci/results/2026-12-05-run53/probe_empty.py > $OUT/probe_before.log 2>&1
  echo "probe before rc $?"; cut -c1-700 $OUT/probe_before.log
fi
install $repo/${NEW:-.whl} && cp $repo/src/stridedfa/*.py /tmp/sfa/stridedfa/
python3 -c "import torch, stridedfa; print(torch.__version__, stridedfa.__version__, stridedfa.info())" >> $OUT/env.txt 2>&1
STRIDEDFA_CACHE_DIR=/tmp/plans-1 timeout 150 python3 -X faulthandler $repo/ci/results/2026-12-05-run53/probe_empty.py > $OUT/probe_after.log 2>&1
echo "probe after rc $?"; cut -c1-700 $OUT/probe_after.log
export STRIDEDFA_CACHE_DIR=/tmp/plans-new
(cd $repo/tests/gpu && timeout ${TESTS_LIMIT:-300} python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short \
  ${TESTS:-test_varlen.py test_paged.py test_variants.py test_persisted_plans.py test_warm_up.py test_context_parallel.py}) > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -1 $OUT/tests.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-250 | head -30
