# GPU run 26: the whole suite (verifies the review fixes, the call-plan/torch splits and the cleanup
# commit), then a host-time breakdown (diagnostic) for issue 9
set -u
ls .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
SKIP_STAGES="fuzz host patterns alloc bench demo" TESTS_TIMEOUT=330 ci/gpu_host_run.sh --quick > /dev/null 2>&1
echo "rc $?"; cat $OUT/summary.txt
(cd /tmp && PYTHONPATH=/tmp/sfa timeout 150 python3 $OLDPWD/.diag/prof_host.py > $OUT/prof_host.log 2>&1; echo "prof rc $?" >> $OUT/prof_host.log)
(cd $OUT && tar xzf logs.tgz && grep -E "passed|failed" pytest.log | tail -1; grep -n "^FAILED" pytest.log | head -30; grep -n "^E  " pytest.log | grep -v "^[0-9]*:E   *[\"{}]\|where\|^[0-9]*:E  *+\|^[0-9]*:E  *assert\|^[0-9]*:E *$" | head -20; ls)
cat $OUT/prof_host.log
