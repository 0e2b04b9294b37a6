# GPU run 24: the variant tests (softcap, sinks added) and the ones run 23 failed, then the stride fuzz
# with variants (window, padding, softcap, deterministic)
set -u
ls .whl/*.whl || exit 3
for t in gpu/test_variants.py gpu/test_variants_adapters.py gpu/test_torch_ops.py gpu/test_jax.py gpu/test_gpu_validation.py; do
  mkdir -p $OUT/t; TESTS_SUBSET=$t SKIP_STAGES="fuzz host patterns alloc bench demo" TESTS_TIMEOUT=150 OUT=$OUT/t ci/gpu_host_run.sh --quick > /dev/null 2>&1
  (cd $OUT/t && tar xzf logs.tgz && echo "== $t: $(grep -E 'passed|failed' pytest.log | tail -1)"; grep -n "^FAILED" pytest.log | head -20; grep -n "^E  " pytest.log | grep -v "^[0-9]*:E   *[\"{}]\|where\|^[0-9]*:E  *+\|^[0-9]*:E  *assert\|^[0-9]*:E *$" | head -12; cp pytest.log $OUT/$(basename $t .py).log)
  rm -rf $OUT/t
done
STRIDEDFA_FUZZ_VALID=4000 STRIDEDFA_FUZZ_INVALID=1000 SKIP_STAGES="tests host patterns alloc bench demo" FUZZ_TIMEOUT=240 ci/gpu_host_run.sh --quick > /dev/null 2>&1
cat $OUT/summary.txt; (cd $OUT && tar xzf logs.tgz && ls && python3 -c "
import json; d=json.load(open('fuzz.json'))
for k,v in d.items(): print(k, json.dumps(v)[:1500])
" 2>&1 | head -40)
