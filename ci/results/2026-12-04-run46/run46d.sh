set -u
repo=$(pwd)
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
ls /tmp/sfa/stridedfa >/dev/null 2>&1 || python3 -m pip install -q --no-index --no-deps --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
mkdir -p /tmp/w && cd /tmp/w
timeout 150 python3 $repo/.diag/probe_gqa_speed.py > $OUT/gqa_speed.log 2>&1; echo "probe rc $?"; grep -v Warn $OUT/gqa_speed.log | cut -c1-1200
