# GPU run 22: variants (window, rows without keys, tiny, padding, deterministic) + demo + probe
set -u
ls .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
(cd /tmp && PYTHONPATH=/tmp/sfa timeout 60 python3 $OLDPWD/.diag/probe_padding.py 2>&1 | tail -8) || true
TESTS_SUBSET=gpu/test_variants.py SKIP_STAGES="fuzz host patterns alloc bench demo" TESTS_TIMEOUT=300 ci/gpu_host_run.sh --quick
echo "rc $?"; cat $OUT/summary.txt; (cd $OUT && tar xzf logs.tgz && grep -n "passed\|failed" pytest.log | tail -3; grep -n "^E  \|^FAILED" pytest.log | grep -v "^E   *[\"{}]" | head -80)
(cd /tmp && PYTHONPATH=/tmp/sfa:$OLDPWD/tests timeout 120 python3 -m pytest -q -p no:cacheprovider $OLDPWD/tests/test_demo.py 2>&1 | tail -3)
