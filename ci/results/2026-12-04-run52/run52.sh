# GPU run 52 (2026-12-04, stop 28): a wheel with the operand views moved to operand_views.cpp, the
# packed operators in _torch_packed and flash_attn_varlen_func with block_table: the whole
# FlashAttention file, then the packed, bias, paged, validation and hardening files.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
timeout 120 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_flash_attn_interface.py \
  > $OUT/fa.log 2>&1
echo "fa rc $?"; tail -1 $OUT/fa.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/fa.log | cut -c1-250 | head -10
for f in test_torch_packed test_bias test_paged test_gpu_validation test_hardening; do
  timeout 75 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/$f.py > $OUT/$f.log 2>&1
  echo "$f rc $?"; tail -1 $OUT/$f.log; grep -E "^(FAILED|ERROR)|^E  " $OUT/$f.log | cut -c1-250 | head -6
done
