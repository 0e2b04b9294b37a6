# GPU run 54 (2026-12-05), one `run` carrying .whl (C++ of 2ad3a86; Python of the working tree): what
# transformers' SDPA gives padded query rows on CUDA (probe), then the GPU files run 53 did not run,
# the changed and new ones first, under one time limit (-v: a cut run still names what passed).
set -u
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false STRIDEDFA_CACHE_DIR=/tmp/plans
mkdir -p /tmp/w && cd /tmp/w
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
PROBE_ONLY=sdpa timeout 60 python3 $repo/ci/results/2026-12-05-run53/probe_empty.py > $OUT/probe_sdpa.log 2>&1
cut -c1-900 $OUT/probe_sdpa.log
(cd $repo/tests/gpu && timeout ${TESTS_LIMIT:-480} python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short \
  test_bounds_check.py test_transformers.py test_flash_attn_interface.py test_persisted_plans.py test_warm_up.py \
  test_context_parallel.py test_bias.py test_dropout.py test_torch_attention.py test_torch_packed.py \
  test_paged_adapters.py test_cupy.py test_jax.py test_torch_compile.py test_torch_ops.py test_forward_backward.py \
  test_zero_size.py test_gpu_validation.py test_hardening.py) > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -c PASSED $OUT/tests.log; tail -1 $OUT/tests.log
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -30
grep -E "::" $OUT/tests.log | tail -1 | cut -c1-200
