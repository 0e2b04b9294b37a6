# GPU run 49 (prepared 2026-12-04, not run: the session's device time was spent): the tests written
# after run 48 and the transformers benchmark without its per-step sync (label -100 instead of
# boolean indexing). Build the wheel first (ci/build_wheel_for_gpu_host.sh): the C++ is that of
# run 47; the Python files are copied over it anyway.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
# never run on a GPU: varlen / per-sequence ALiBi and a paged cache with ALiBi (FlashAttention interface);
# the whole transformers file again -- after run 47 its mask paths changed (review fixes: bidirectional
# masks keep every query row, dense calls with s_q = s_kv say top-left) and it gained the collator,
# set_padding_check(False) and T5 tests
timeout 60 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_flash_attn_interface.py \
  -k alibi > $OUT/fa_new.log 2>&1
echo "fa rc $?"; tail -1 $OUT/fa_new.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fa_new.log | cut -c1-250 | head -10
timeout 200 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py \
  > $OUT/transformers_tests.log 2>&1
echo "transformers rc $?"; tail -1 $OUT/transformers_tests.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/transformers_tests.log | cut -c1-250 | head -20
timeout 300 python3 $repo/benchmarks/bench_transformers.py --out $OUT/bench > $OUT/bench.log 2>&1
echo "bench rc $?"; grep -v '^{' $OUT/bench/transformers.md 2>/dev/null || grep '^{' $OUT/bench.log | cut -c1-200
