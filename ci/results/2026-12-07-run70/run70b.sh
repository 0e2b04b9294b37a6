#!/usr/bin/env bash
# GPU run 70, second call (~9 min): probe70 (probe68's dense tail after the merged copies), then
# issue 33 item 4: generation with dynamic and static caches for five models (steady state in five
# alternating rounds), the decode-step profile beside it, and the paged decode benchmark (quick).
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
site=/tmp/sfa
rm -rf $site && python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl && cp src/stridedfa/*.py "$site/stridedfa/"
export PYTHONPATH=$site PYTHONUNBUFFERED=1 STRIDEDFA_CACHE_DIR=/tmp/plans-b
mkdir -p /tmp/w && cd /tmp/w || exit 3
timeout 80 python3 "$repo/ci/results/2026-12-07-run70/probe70.py" > "$OUT/probe70.log" 2>&1; echo "probe70 rc $?"
cut -c1-600 "$OUT/probe70.log"; pack
timeout 280 python3 "$repo/benchmarks/bench_transformers.py" --generate --no-training --hidden 1024 \
  --models llama,qwen3,mistral,gemma2,gpt_oss --out "$OUT/generate" > "$OUT/generate.log" 2>&1; echo "generate rc $?"
grep -E "^\||geomean" "$OUT/generate.log" | tail -30; pack
timeout 90 python3 "$repo/benchmarks/profile_transformers_step.py" --decode --models llama,mistral --out "$OUT/profile" \
  > "$OUT/profile.log" 2>&1; echo "profile rc $?"; tail -12 "$OUT/profile.log"; pack
timeout 100 python3 "$repo/benchmarks/bench_paged.py" --quick --out "$OUT/paged" > "$OUT/paged.log" 2>&1; echo "paged rc $?"
tail -25 "$OUT/paged.log"; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
