# GPU run 45 (prepared 2026-12-04; build the wheel first: ci/build_wheel_for_gpu_host.sh): the
# FlashAttention interface's GPU tests (never run yet), then the rest of the suite that run 43 cut
# (test_varlen.py). Second command: the stride fuzz at 10,000 / 2,000 (run 43b ran 3,008 / 1,024).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/w && cd /tmp/w
timeout 200 python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short $repo/tests/gpu/test_flash_attn_interface.py \
  > $OUT/fa.log 2>&1
echo "fa rc $?"; grep -E "passed|failed" $OUT/fa.log | tail -1; grep -E "^(FAILED|ERROR)|^E  " $OUT/fa.log | cut -c1-250 | head -30
timeout 300 python3 -m pytest -p no:cacheprovider -q -rfEs $repo/tests/gpu/test_varlen.py > $OUT/varlen.log 2>&1
echo "varlen rc $?"; tail -2 $OUT/varlen.log | cut -c1-250
