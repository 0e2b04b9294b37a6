# Next GPU run, part B of 2 (dense suites, bench_paged) (prepared 2026-12-03, after GPU run 35b; nothing since 229f15c has run on a GPU):
# build the wheel first (ci/build_wheel_for_gpu_host.sh), then `run` this with carry [".whl"].
# (1) the varlen and paged-KV tests (interleaved-view refusal and torch copies, CuPy, JAX, dispatcher, opcheck,
# packed entry point, the small transformer, the fuzz), (2) memcheck on the varlen tests,
# (3) bench_varlen (with the full padded batch as the FLOP-ideal base), (4) the dense suites the
# core change touches, each under its own time limit. Record in ci/results/<date>-run36/.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 200 python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEx $repo/tests/gpu/test_variants.py \
  $repo/tests/gpu/test_forward_backward.py $repo/tests/gpu/test_jax.py $repo/tests/gpu/test_torch_ops.py > dense.log 2>&1
echo "dense rc $?"; tail -2 dense.log; grep -E "^FAILED" dense.log | cut -c1-200 | head
timeout 120 python3 $repo/benchmarks/bench_paged.py --out $OUT --quick > bench_paged.log 2>&1
echo "bench paged rc $?"; tail -30 bench_paged.log

