# GPU run 48 (prepared 2026-12-04): cache_leftpad's GPU test; the kernels of the training steps
# slower than SDPA (bert, gpt_neox, qwen3); generation tokens/s with a static cache.
# Wheel of run 47 (C++ unchanged since); this commit's Python files copied over it.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1
mkdir -p /tmp/w && cd /tmp/w
timeout 60 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short $repo/tests/gpu/test_flash_attn_interface.py > $OUT/fa.log 2>&1
echo "fa rc $?"; tail -1 $OUT/fa.log; grep -E "^E  " $OUT/fa.log | head -5
timeout 120 python3 $repo/.diag/profile_steps.py $repo bert,gpt_neox,qwen3 > $OUT/profile_steps.log 2>&1
echo "profile rc $?"; grep -v Warn $OUT/profile_steps.log | grep -v "^\[transformers\]" | cut -c1-110
timeout 200 python3 $repo/benchmarks/bench_transformers.py --out $OUT/gen --models llama --generate --quick > $OUT/gen.log 2>&1
echo "gen rc $?"; tail -4 $OUT/gen/transformers.md 2>/dev/null || tail -5 $OUT/gen.log
