# GPU run 34a: the whole GPU suite but the fuzz (first run of everything after ab46904: dropout
# follow-ups, JAX jacrev / fixed-sinks tests, opcheck with dropout, the s = 1 bias refusal)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 560 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx $repo/tests/gpu \
  --deselect $repo/tests/gpu/test_stride_fuzz.py > pytest.log 2>&1
echo "tests rc $?"; grep -E " passed| failed" pytest.log | tail -1
grep -E "(FAILED|ERROR)" pytest.log | cut -c1-250 | head -40
grep -E "^E  " pytest.log | cut -c1-250 | head -30
tail -3 pytest.log
