# GPU run 25: the whole suite, the host-overhead benchmark (quick) and the variants benchmark (quick)
set -u
ls .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
SKIP_STAGES="fuzz patterns alloc bench demo" TESTS_TIMEOUT=300 HOST_BENCH_TIMEOUT=110 ci/gpu_host_run.sh --quick > /dev/null 2>&1
echo "rc $?"; cat $OUT/summary.txt
(cd /tmp && PYTHONPATH=/tmp/sfa timeout 130 python3 $OLDPWD/benchmarks/bench_variants.py --quick --out $OUT/variants > $OUT/bench_variants.log 2>&1; echo "bench rc $?" >> $OUT/bench_variants.log)
(cd $OUT && tar xzf logs.tgz && grep -E "passed|failed" pytest.log | tail -1; grep -n "^FAILED" pytest.log | head -30; grep -n "^E  " pytest.log | grep -v "^[0-9]*:E   *[\"{}]\|where\|^[0-9]*:E  *+\|^[0-9]*:E  *assert\|^[0-9]*:E *$" | head -20; ls; tail -30 bench_host_overhead.log)
tail -22 $OUT/bench_variants.log
