# GPU run 40 (2026-12-04): the MQA varlen refusal and the adapters' repeat of the one head; call
# patterns (training steps) with torch.profiler tables; host overhead; where a paged decode step's
# time goes (.diag/paged_host.py, copied into the record).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
python3 -c "import stridedfa, json; print(json.dumps(stridedfa.info(), default=str)[:600])"
STRIDEDFA_VARLEN_FUZZ=12 timeout 100 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=line \
  $repo/tests/gpu/test_varlen.py -k "mqa or views_of_one or fuzzed" > varlen.log 2>&1
echo "varlen rc $?"; tail -15 varlen.log | cut -c1-250
timeout 60 python3 $repo/.diag/paged_host.py > paged_host.log 2>&1; echo "paged_host rc $?"; cat paged_host.log | tail -12
mkdir -p patterns host
(cd $repo/benchmarks && timeout 150 python3 bench_call_patterns.py --out $OUT/patterns --quick --profile > $OUT/patterns/log 2>&1); echo "patterns rc $?"
tail -22 patterns/bench_call_patterns.md
(cd $repo/benchmarks && timeout 150 python3 bench_host_overhead.py --out $OUT/host --quick > $OUT/host/log 2>&1); echo "host rc $?"
grep -E "^\| |NOT|met" host/bench_host_overhead.md | cut -c1-120
