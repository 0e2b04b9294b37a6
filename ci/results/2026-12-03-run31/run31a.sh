# GPU run 31a (196e06c): the whole GPU suite (bias/ALiBi fixes after run 30 included) and the
# variants benchmark (quick; its bias and ALiBi rows never ran before)
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
cd $OUT
timeout 330 python3 -X faulthandler -m pytest -p no:cacheprovider -q -rfEx $repo/tests/gpu > pytest.log 2>&1
echo "tests rc $?"; grep -E "passed|failed" pytest.log | tail -1
grep -E "^(FAILED|ERROR|XFAIL)" pytest.log | cut -c1-300 | head -70
timeout 200 python3 $repo/benchmarks/bench_variants.py --out $OUT --quick > bench_variants.log 2>&1
echo "bench rc $?"; tail -40 bench_variants.log; ls $OUT
