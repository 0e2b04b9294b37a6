# GPU run 28: host-time work of issue 9 (CuPy intake in C integers, autograd Function trimmed, the
# basic inference operator, dispatcher fast path): the whole suite, the host-overhead benchmark and
# the call-patterns benchmark (training steps), quick
set -u
ls .whl/*.whl || exit 3
SKIP_STAGES="fuzz alloc bench demo" TESTS_TIMEOUT=270 HOST_BENCH_TIMEOUT=130 PATTERNS_TIMEOUT=150 ci/gpu_host_run.sh --quick > /dev/null 2>&1
echo "rc $?"; cat $OUT/summary.txt
(cd $OUT && tar xzf logs.tgz && grep -E "passed|failed" pytest.log | tail -1; grep -n "^FAILED" pytest.log | head -30; grep -n "^E  " pytest.log | grep -v "^[0-9]*:E   *[\"{}]\|where\|^[0-9]*:E  *+\|^[0-9]*:E  *assert\|^[0-9]*:E *$" | head -20; rm -f pytest.xml; ls; grep "|\|met" bench_host_overhead.md | head -40; tail -40 bench_call_patterns.md 2>/dev/null || tail -30 bench_call_patterns.log)
