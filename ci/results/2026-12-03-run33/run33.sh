# GPU run 33 (dropout everywhere incl. JAX; refusals after run 32): the dropout tests, the JAX
# tests (verbose: run 31's unnamed failures), the s = 1 bias refusal, then the stride fuzz with
# dropout on 12% of its cases (1500 valid / 100 invalid)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 170 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx $repo/tests/gpu/test_dropout.py \
  $repo/tests/gpu/test_jax.py "$repo/tests/gpu/test_bias.py::test_a_bias_cut_to_one_row_and_key_is_refused_with_lse" \
  > pytest.log 2>&1
echo "tests rc $?"; grep -E " passed| failed" pytest.log | tail -1
grep -E "(FAILED|ERROR)" pytest.log | cut -c1-250 | head -40
grep -E "^E  " pytest.log | cut -c1-250 | head -30
STRIDEDFA_FUZZ_VALID=1500 STRIDEDFA_FUZZ_INVALID=100 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 80 \
  python3 -X faulthandler -m pytest -p no:cacheprovider -q $repo/tests/gpu/test_stride_fuzz.py > fuzz.log 2>&1
echo "fuzz rc $?"; tail -2 fuzz.log
python3 -c "
import json; d=json.load(open('fuzz.json'))
for k in ('valid','invalid'):
    v=d.get(k,{}); print(k, v.get('cases'), v.get('complete'), v.get('counts')); print({x: n for x, n in v.get('by_variant', {}).items() if x.startswith('dropout')})
    for name, ex in v.get('examples',{}).items():
        if name.startswith('FAIL'): print(name, sorted(set(ex))[:6])
"
