# GPU run 42 (2026-12-04): the varlen torch path rebuilt on torch.library + an eager autograd
# Function (Python only: the wheel of run 41, 3f926ca, with src/stridedfa/*.py of this commit copied
# over it -- the compiled module did not change). The whole varlen suite (60 fuzz cases), the
# varlen step's host time (.diag/varlen_host.py, timing part), bench_varlen (full).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp $repo/src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
STRIDEDFA_VARLEN_FUZZ=60 timeout 280 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_varlen.py > varlen.log 2>&1
echo "varlen rc $?"; tail -3 varlen.log | cut -c1-250; grep -E "^(FAILED|ERROR)" varlen.log | cut -c1-250
timeout 60 python3 $repo/.diag/varlen_host.py $repo/benchmarks > varlen_host.log 2>&1; echo "varlen_host rc $?"; head -2 varlen_host.log
mkdir -p bench
timeout 150 python3 $repo/benchmarks/bench_varlen.py --out $OUT/bench > bench/log 2>&1; echo "bench_varlen rc $?"
python3 -c "
import json; d = json.load(open('bench/varlen.json')); print(d['ms_per_step']); print(d['speedup_vs_torch_sdpa_padded']); print(d['vs_flop_ideal']); print(d['targets'])"
