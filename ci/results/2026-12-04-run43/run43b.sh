# GPU run 43b (2026-12-04): the stride fuzz (dense, every variant riding on the layouts) on this
# session's code, 3,000 valid and 1,000 invalid layouts (the device time left did not allow 10,000).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp $repo/src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/w && cd /tmp/w  # hypothesis writes its database here, not into $OUT
STRIDEDFA_FUZZ_VALID=3000 STRIDEDFA_FUZZ_INVALID=1000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 330 \
  python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEs $repo/tests/gpu/test_stride_fuzz.py > $OUT/fuzz.log 2>&1
echo "fuzz rc $?"; tail -3 $OUT/fuzz.log | cut -c1-250
