#!/usr/bin/env bash
# The current GPU suite runner, for one lent device host (ci/gpu_host.md): the whole GPU suite in
# three parts that one `run` command runs at once on the card (-v: a part cut by its timeout still
# names what passed; run 70 ran two halves and the fuzz so: `git show 0f20685:ci/results/2026-12-07-run70/run70a.sh`),
# and the stride fuzz beside them. Carry the wheel in .whl/ (built by
# ci/build_wheel_for_gpu_host.sh); the working tree's Python files are copied over the wheel's.
#   PART=suite1 | suite2 | suite3 | fuzz  bash ci/gpu_suite.sh    (SUITE_LIMIT, default 570 s; the fuzz: FUZZ_VALID, FUZZ_INVALID, FUZZ_LIMIT)
#   PART=files FILES="test_jax.py test_varlen.py" LIMIT=150 bash ci/gpu_suite.sh   (some files, when
#   device time is short: what a change touched)
# Logs and env.txt go to $OUT; record the run as ci/results/README.md says. Every file of
# tests/gpu/ is in one part except test_stride_fuzz.py (PART=fuzz). First run as GPU runs 56-57 (2026-12-05; its copy there:
# `git show 62553a9^:ci/results/2026-12-05-run56/run.sh`).
set -u
: "${PART:?set PART=suite1, suite2, suite3, fuzz or files}"
ls .whl/*.whl || exit 3
repo=$(pwd)
site=/tmp/sfa-$PART  # one per part: two parts may run at once on one card (PART=suite1 & PART=suite2)
rm -rf "$site" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
cp src/stridedfa/*.py "$site/stridedfa/"
export PYTHONPATH=$site PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export STRIDEDFA_CACHE_DIR="$OUT/plans-$PART"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
run_tests() {  # name, timeout, files...
  local name=$1 limit=$2; shift 2
  (cd "$repo/tests/gpu" && timeout "$limit" python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short "$@" \
    -o cache_dir=/tmp/.c) > "$OUT/$name.log" 2>&1
  echo "$name rc $?"; tail -1 "$OUT/$name.log"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/$name.log" | cut -c1-250 | head -20
  grep -E "::" "$OUT/$name.log" | tail -1 | cut -c1-200
}
case "$PART" in
  files)
    # shellcheck disable=SC2086  # FILES is a list of test files
    run_tests files "${LIMIT:-300}" ${FILES:?set FILES to test files of tests/gpu} ;;
  suite1)
    run_tests suite1 "${SUITE_LIMIT:-570}" test_cudnn_quirks.py test_empty_sequences.py test_sinks_decode.py test_bounds_check.py test_variants.py \
      test_varlen.py test_paged.py test_bitexact.py test_cupy.py test_flash_attn_interface.py \
      test_forward_backward.py test_generic_buffer.py test_gpu_cache.py test_gpu_validation.py test_hardening.py \
      test_import_order.py test_jax.py test_paged_adapters.py test_producers.py ;;
  suite2)
    run_tests suite2 "${SUITE_LIMIT:-570}" test_transformers.py test_persisted_plans.py test_warm_up.py test_context_parallel.py \
      test_bias.py test_dropout.py test_torch_attention.py test_torch_packed.py test_streams.py \
      test_torch_compile.py test_torch_ops.py test_torch_streams.py test_variants_adapters.py test_zero_size.py ;;
  suite3)  # the decoding plans' files: suite2 with them took 551 of its 570 s in run 70
    run_tests suite3 "${SUITE_LIMIT:-570}" test_decode_graphs.py test_decode_by_tokens.py test_split_kv.py test_decode_prefix_tail.py ;;
  fuzz)
    STRIDEDFA_FUZZ_INVALID=${FUZZ_INVALID:-1000} STRIDEDFA_FUZZ_VALID=${FUZZ_VALID:-4000} \
      STRIDEDFA_FUZZ_REPORT="$OUT/fuzz.json" timeout "${FUZZ_LIMIT:-400}" \
      python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short "$repo/tests/gpu/test_stride_fuzz.py" > "$OUT/fuzz.log" 2>&1
    echo "fuzz rc $?"; tail -1 "$OUT/fuzz.log"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/fuzz.log" | cut -c1-250 | head -8
    python3 -c "import json; d=json.load(open('$OUT/fuzz.json')); print({k: (v['cases'], v['counts']) for k, v in d.items() if isinstance(v, dict) and 'cases' in v})" ;;
esac
rm -rf "${OUT:?}/plans-$PART"
