# GPU run 35c: which THD operand layouts cuDNN addresses right (diag_thd_strides.py)
set -u
repo=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .diag/whl/*.whl
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
cd $OUT
timeout 100 python3 $repo/ci/results/2026-12-03-run34/diag_thd_strides.py > diag.log 2>&1
echo "diag rc $?"; cat diag.log | cut -c1-200
