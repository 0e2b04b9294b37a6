# GPU run 40 (prepared 2026-12-03, short: the session's device time is nearly spent): the MQA
# refusal and the adapters' repeat of the one head (torch), the views test, 12 fuzz cases.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
cd $OUT
STRIDEDFA_VARLEN_FUZZ=12 timeout 75 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=line \
  $repo/tests/gpu/test_varlen.py -k "mqa or views_of_one or fuzzed" > varlen.log 2>&1
echo "varlen rc $?"; tail -15 varlen.log | cut -c1-250
