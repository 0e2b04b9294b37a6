# GPU run 27: the stride fuzz at scale with every variant (10,000 valid / 2,000 invalid layouts)
set -u
ls .whl/*.whl || exit 3
STRIDEDFA_FUZZ_VALID=10000 STRIDEDFA_FUZZ_INVALID=2000 SKIP_STAGES="tests host patterns alloc bench demo" FUZZ_TIMEOUT=480 ci/gpu_host_run.sh --quick > /dev/null 2>&1
cat $OUT/summary.txt; (cd $OUT && tar xzf logs.tgz && ls && tail -5 fuzz.log && python3 -c "
import json; d=json.load(open('fuzz.json'))
for k,v in d.items(): print(k, json.dumps(v)[:1500])
" 2>&1 | head -40)
