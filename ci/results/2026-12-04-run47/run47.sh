# GPU run 47 (prepared 2026-12-04): the core keys and runs bottom-right as top-left where every
# sequence has as many queries as keys (sdpa.cpp diagonals_coincide). First command: the
# transformers tests, then the causal/alignment tests of the files that exercise bottom-right.
# Second command (BENCH=1): bench_transformers.py.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p /tmp/w && cd /tmp/w
if [ "${BENCH:-0}" = 1 ]; then
  timeout 400 python3 $repo/benchmarks/bench_transformers.py --out $OUT/bench ${BENCH_ARGS:-} > $OUT/bench.log 2>&1
  echo "bench rc $?"; grep -v '^{' $OUT/bench/transformers.md
  exit 0
fi
timeout 150 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py > $OUT/transformers_tests.log 2>&1
echo "transformers rc $?"; tail -1 $OUT/transformers_tests.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/transformers_tests.log | cut -c1-250 | head -12
cd $repo/tests/gpu && timeout 330 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short -k "bottom or causal or align or window" \
  test_forward_backward.py test_variants.py test_bias.py test_dropout.py test_torch_attention.py test_flash_attn_interface.py test_varlen.py test_bitexact.py \
  -o cache_dir=/tmp/w/.c > $OUT/alignment_tests.log 2>&1
echo "alignment rc $?"; tail -1 $OUT/alignment_tests.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/alignment_tests.log | cut -c1-250 | head -20
