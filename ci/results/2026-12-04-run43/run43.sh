# GPU run 43 (2026-12-04): the whole GPU suite on this session's code but the parts run 41/42 saw
# on the same code (test_varlen.py, test_paged*.py) and the fuzz (its own command: run43b.sh). The
# wheel of 3f926ca (run 41) with src/stridedfa/*.py of this commit copied over it (no compiled
# change since 3f926ca).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp $repo/src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 540 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx $repo/tests/gpu \
  --deselect $repo/tests/gpu/test_stride_fuzz.py --deselect $repo/tests/gpu/test_varlen.py \
  --deselect $repo/tests/gpu/test_paged.py --deselect $repo/tests/gpu/test_paged_adapters.py > pytest.log 2>&1
echo "tests rc $?"; grep -E " passed| failed" pytest.log | tail -1
grep -E "(FAILED|ERROR)" pytest.log | cut -c1-250 | head -40
grep -E "^E  " pytest.log | cut -c1-250 | head -30
tail -3 pytest.log | cut -c1-250
