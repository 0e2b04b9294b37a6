# GPU run 51 (2026-12-04, stop 28): the stride fuzz's invalid layouts at the CI scale (2,000) and
# 4,000 more valid layouts (run 50 drew 6,016 before its time limit: 10,016 in this session), then
# the host-overhead benchmark as the code stands (last run: 40).
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
STRIDEDFA_FUZZ_INVALID=2000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz_invalid.json timeout 120 python3 -m pytest \
  -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_stride_fuzz.py -k invalid > $OUT/fuzz_invalid.log 2>&1
echo "invalid rc $?"; tail -1 $OUT/fuzz_invalid.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fuzz_invalid.log | cut -c1-250 | head -8
STRIDEDFA_FUZZ_VALID=4000 STRIDEDFA_FUZZ_REPORT=$OUT/fuzz_valid.json timeout 300 python3 -m pytest \
  -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_stride_fuzz.py -k "valid and not invalid" \
  > $OUT/fuzz_valid.log 2>&1
echo "valid rc $?"; tail -1 $OUT/fuzz_valid.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fuzz_valid.log | cut -c1-250 | head -8
python3 -c "import json; d=json.load(open('$OUT/fuzz_invalid.json')); print('invalid', d['invalid']['cases'], d['invalid']['counts'])"
python3 -c "import json; d=json.load(open('$OUT/fuzz_valid.json')); print('valid', d['valid']['cases'], d['valid']['counts'])"
timeout 120 python3 $repo/benchmarks/bench_host_overhead.py --out $OUT/host > $OUT/host.log 2>&1
echo "host rc $?"; sed -n '/^| path/,/^$/p' $OUT/host/*.md 2>/dev/null | head -30; grep -A14 "^Targets" $OUT/host/*.md 2>/dev/null
