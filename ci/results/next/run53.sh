# GPU run 53 (prepared 2026-12-04, stop 29, which had no GPU): everything stop 29 built, then the
# whole suite. One `run` command per PART (each <= 10 min), carrying .whl:
#   PART=new    stop 29's new GPU tests: persisted plans, warm-up, context parallel (world 1),
#               and the files whose code paths moved (torch bias/dropout/sinks training, JAX)
#   PART=suite1 / PART=suite2   the whole GPU suite in two halves (issue 10 item 7)
#   PART=fuzz   the stride fuzz at 2,000 invalid + 10,000 valid in one command (issue 9)
#   PART=bench  bench_host_overhead, bench_cold_start, bench_varlen (issue 9, issue 14 (b), issue 12 (a))
# Persisted plans: each part gets its own STRIDEDFA_CACHE_DIR under $OUT, so that what it reports
# as build time is build time; the `new` part's test_persisted_plans uses directories of its own.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export STRIDEDFA_CACHE_DIR=$OUT/plans-${PART:-new}
mkdir -p /tmp/w && cd /tmp/w
run_tests() {  # name, timeout, files...
  local name=$1 limit=$2; shift 2
  (cd $repo/tests/gpu && timeout $limit python3 -m pytest -p no:cacheprovider -v -rfEs --tb=short "$@" \
    -o cache_dir=/tmp/w/.c) > $OUT/$name.log 2>&1
  echo "$name rc $?"; tail -1 $OUT/$name.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-250 | head -20
}
case "${PART:-new}" in
  new)
    run_tests new 540 test_persisted_plans.py test_warm_up.py test_context_parallel.py test_bias.py test_dropout.py \
      test_torch_attention.py test_torch_packed.py
    python3 -c "import stridedfa, json; print(json.dumps(stridedfa.cache_info()['persistent']))" ;;
  suite1)
    run_tests suite1 560 test_bitexact.py test_cupy.py test_flash_attn_interface.py test_forward_backward.py \
      test_generic_buffer.py test_gpu_cache.py test_gpu_validation.py test_hardening.py test_import_order.py \
      test_jax.py test_paged.py test_paged_adapters.py test_producers.py ;;
  suite2)
    run_tests suite2 560 test_streams.py test_torch_compile.py test_torch_ops.py test_torch_streams.py \
      test_transformers.py test_variants.py test_variants_adapters.py test_varlen.py test_zero_size.py ;;
  fuzz)
    STRIDEDFA_FUZZ_INVALID=2000 STRIDEDFA_FUZZ_VALID=10000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json timeout 570 \
      python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_stride_fuzz.py > $OUT/fuzz.log 2>&1
    echo "fuzz rc $?"; tail -1 $OUT/fuzz.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fuzz.log | cut -c1-250 | head -8
    python3 -c "import json; d=json.load(open('$OUT/fuzz.json')); print({k: (v['cases'], v['counts']) for k, v in d.items() if isinstance(v, dict) and 'cases' in v})" ;;
  bench)
    timeout 150 python3 $repo/benchmarks/bench_host_overhead.py --out $OUT/host > $OUT/host.log 2>&1
    echo "host rc $?"; sed -n '/^| path/,/^$/p' $OUT/host/*.md 2>/dev/null | head -40
    timeout 300 python3 $repo/benchmarks/bench_cold_start.py --out $OUT/cold --repeats 3 > $OUT/cold.log 2>&1
    echo "cold rc $?"; cat $OUT/cold/bench_cold_start.md 2>/dev/null
    timeout 120 python3 $repo/benchmarks/bench_varlen.py --out $OUT/varlen > $OUT/varlen.log 2>&1
    echo "varlen rc $?"; python3 -c "import json; d=json.load(open('$OUT/varlen/varlen.json')); print(d['ms_per_step'], d['vs_documents_alone'], d['targets'])" ;;
esac
