# GPU run 29: verify 293b370 (whole suite), host-overhead benchmark, CuPy host-time pieces
set -u
ls .whl/*.whl || exit 3
SKIP_STAGES="fuzz patterns alloc bench demo" TESTS_TIMEOUT=290 HOST_BENCH_TIMEOUT=130 ci/gpu_host_run.sh --quick > /dev/null 2>&1
echo "rc $?"; cat $OUT/summary.txt

(cd $OUT && tar xzf logs.tgz && grep -E "passed|failed" pytest.log | tail -1; grep -n "^FAILED" pytest.log | head -30; rm -f pytest.xml; ls; grep "|\|met" bench_host_overhead.md | head -40)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
PYTHONPATH=/tmp/sfa timeout 120 python3 -X faulthandler .diag/prof_cupy.py > $OUT/prof_cupy.log 2>&1; echo "prof rc $?"; cat $OUT/prof_cupy.log
