# GPU run 50 (2026-12-04, stop 28): run 49's three failures after their fixes (ALiBi aligned per
# sequence, attended back to front; T5's strided position bias), the backward host-time probe,
# then the stride fuzz at the CI scale (10,000 valid / 2,000 invalid) as far as the time allows.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
timeout 90 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_flash_attn_interface.py \
  -k "alibi or kvcache or cache" > $OUT/fa_alibi.log 2>&1
echo "fa rc $?"; tail -1 $OUT/fa_alibi.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fa_alibi.log | cut -c1-250 | head -12
timeout 60 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_transformers.py -k t5 \
  > $OUT/t5.log 2>&1
echo "t5 rc $?"; tail -1 $OUT/t5.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/t5.log | cut -c1-250 | head -5
timeout 60 python3 $repo/ci/results/next/probe_backward_host.py > $OUT/probe_backward_host.txt 2>&1
echo "probe rc $?"; tail -20 $OUT/probe_backward_host.txt
STRIDEDFA_FUZZ_VALID=10000 STRIDEDFA_FUZZ_INVALID=2000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz.json \
  timeout 330 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_stride_fuzz.py \
  > $OUT/fuzz.log 2>&1
echo "fuzz rc $?"; tail -1 $OUT/fuzz.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fuzz.log | cut -c1-250 | head -8
cat $OUT/fuzz.json 2>/dev/null | head -c 1500
