#!/usr/bin/env bash
# GPU run 68 (~6 min; build the wheel first): stop 45's last code -- decoding by tokens (with its
# stride fuzz), paged, its adapters, the flash_attn interface; memcheck; bench_paged --quick (they come
# back as tests.tgz); then probe68 (8-16 queries by a prefix and a tail: probe68.log, probe68.json).
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/tests.tgz --exclude=tests.tgz . && mv /tmp/tests.tgz tests.tgz); }
PART=files LIMIT=150 FILES="test_decode_by_tokens.py test_paged.py test_paged_adapters.py test_flash_attn_interface.py" bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py -k "not random_strides" > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
timeout 150 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"
pack; (cd $OUT && find . -type f ! -name tests.tgz -delete)
(cd /tmp && timeout 90 python3 "$repo/ci/results/2026-12-07-run68/probe68.py" > "$OUT/probe68.log" 2>&1); echo "probe68 rc $?"
cut -c1-500 "$OUT/probe68.log"; ls "$OUT"
# Where generation's steady-state decoding step goes (issue 33 item 4: qwen3 and mistral 0.87-0.94x SDPA)
timeout 150 python3 benchmarks/profile_transformers_step.py --out $OUT/decode_profile --models qwen3,mistral,llama \
  --decode --batch 8 --seq 512 --steps 20 --hidden 1024 > $OUT/decode_profile.log 2>&1; echo "decode profile rc $?"
grep -v "^    " $OUT/decode_profile.log | cut -c1-600 | tail -8
(cd $OUT && tar czf decode_profile.tgz decode_profile decode_profile.log && rm -rf decode_profile decode_profile.log)
