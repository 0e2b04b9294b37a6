# GPU run 44 (2026-12-04): varlen_packed_attention's eager backward into one gradient buffer, and
# CuPy's paged out by the layout rule. The wheel of 3f926ca with src/stridedfa/*.py of this commit.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp $repo/src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/w && cd /tmp/w
timeout 150 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_varlen.py \
  -k "packed or transformer" $repo/tests/gpu/test_paged_adapters.py > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/tests.log | cut -c1-250; grep -E "^(FAILED|ERROR)|Error" $OUT/tests.log | cut -c1-250 | head
