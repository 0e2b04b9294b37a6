# GPU run 23: the whole suite with the variants (window, padding, rows without keys, deterministic,
# every adapter), and the padding probe (what cuDNN writes at padded rows) into $OUT/probe.txt
set -u
ls .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
(cd /tmp && PYTHONPATH=/tmp/sfa timeout 60 python3 $OLDPWD/.diag/probe_padding.py > $OUT/probe.txt 2>&1) || true
SKIP_STAGES="fuzz host patterns alloc bench demo" TESTS_TIMEOUT=330 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt; cat $OUT/probe.txt | tail -8
(cd $OUT && tar xzf logs.tgz && grep -n "passed\|failed" pytest.log | tail -2; grep -n "^FAILED\|^ERROR" pytest.log | head -40; grep -n "^E  " pytest.log | grep -v "^[0-9]*:E   *[\"{}]\|where\|^[0-9]*:E  *+\|^[0-9]*:E  *assert\|^[0-9]*:E *$" | head -40)
(cd /tmp && PYTHONPATH=/tmp/sfa timeout 170 python3 $OLDPWD/benchmarks/bench_variants.py --quick --out $OUT/variants > $OUT/bench_variants.log 2>&1; echo "bench rc $?" >> $OUT/bench_variants.log)
tail -25 $OUT/bench_variants.log
