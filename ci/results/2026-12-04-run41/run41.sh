# GPU run 41 (2026-12-04): the paged decode step's eager path (one C call, no custom_op), its tests
# and benchmark; where a varlen step's device time goes (.diag/varlen_kernels.py); training-step
# profiles (bench_call_patterns --profile, tarred: the device tool brings back few files).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
python3 -c "import stridedfa; print(stridedfa.info()['build'])"
timeout 150 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_paged.py \
  $repo/tests/gpu/test_paged_adapters.py > paged.log 2>&1
echo "paged tests rc $?"; tail -5 paged.log | cut -c1-250; grep -E "^(FAILED|ERROR)" paged.log | cut -c1-250
timeout 60 python3 $repo/.diag/paged_host.py > paged_host.log 2>&1; echo "paged_host rc $?"; tail -9 paged_host.log
mkdir -p paged
timeout 120 python3 $repo/benchmarks/bench_paged.py --out $OUT/paged --quick > /dev/null 2> paged/err
echo "bench paged rc $?"; python3 -c "
import json; d = json.load(open('paged/paged.json'))
for r in d['rows']: print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if 'varlen' not in k})"
timeout 90 python3 $repo/.diag/varlen_kernels.py $repo/benchmarks > varlen_kernels.log 2>&1; echo "varlen kernels rc $?"
grep -E "^===|Self CUDA time total" varlen_kernels.log
mkdir -p patterns
(cd $repo/benchmarks && timeout 150 python3 bench_call_patterns.py --out $OUT/patterns --quick --profile > $OUT/patterns/log 2>&1); echo "patterns rc $?"
tail -9 patterns/bench_call_patterns.md
tar czf profiles.tgz patterns/profile_*.txt && rm patterns/profile_*.txt patterns/log
