# GPU run 32 (dropout, a4d9bb5): the dropout tests; the torch files of run 31a's suite, verbose
# (its 8 failures were cut off unnamed by the time limit); the s_kv = 1 bias diagnostic
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 100 python3 $repo/ci/results/2026-12-03-run32/diag_bias_skv1.py > diag_bias_skv1.log 2>&1
echo "diag rc $?"; cat diag_bias_skv1.log | tail -14
timeout 330 python3 -X faulthandler -m pytest -p no:cacheprovider -v -rfEx -p no:randomly \
  $repo/tests/gpu/test_dropout.py $repo/tests/gpu/test_torch_attention.py $repo/tests/gpu/test_torch_compile.py \
  $repo/tests/gpu/test_torch_ops.py $repo/tests/gpu/test_torch_packed.py $repo/tests/gpu/test_torch_streams.py \
  > pytest.log 2>&1
echo "tests rc $?"; grep -E " passed| failed" pytest.log | tail -1
grep -E "(FAILED|ERROR)" pytest.log | cut -c1-330 | head -60
grep -E "^E  " pytest.log | cut -c1-250 | head -40
timeout 150 python3 $repo/benchmarks/bench_variants.py --out $OUT --quick > bench_variants.log 2>&1
echo "bench rc $?"; cat variants.md 2>/dev/null | tail -12
