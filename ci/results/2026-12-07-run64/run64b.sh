#!/usr/bin/env bash
# GPU run 64, command 2: generation (issue 33 item 4): the dynamic cache for five models (bucketed
# decode graphs, now the default), llama and gemma2 with the exact plan, llama's static cache.
set -u
site=/tmp/sfa-gen; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }
timeout 200 python3 benchmarks/bench_transformers.py --out $OUT/gen-dynamic --generate --no-training --hidden 1024 --caches dynamic --models llama,qwen3,mistral,gemma2,gpt_oss > $OUT/gen-dynamic.log 2>&1; echo "gen dynamic rc $?"; grep -E "^\|" $OUT/gen-dynamic.log | tail -12; grep -E "Error|error" $OUT/gen-dynamic.log | tail -3; pack
STRIDEDFA_DECODE_GRAPHS=exact timeout 100 python3 benchmarks/bench_transformers.py --out $OUT/gen-dynamic-exact --generate --no-training --hidden 1024 --caches dynamic --models llama,gemma2 > $OUT/gen-dynamic-exact.log 2>&1; echo "gen dynamic exact rc $?"; grep -E "^\|" $OUT/gen-dynamic-exact.log | tail -6; pack
timeout 170 python3 benchmarks/bench_transformers.py --out $OUT/gen-static --generate --no-training --hidden 1024 --caches static --models llama > $OUT/gen-static.log 2>&1; echo "gen static rc $?"; grep -E "^\|" $OUT/gen-static.log | tail -4
pack; ls $OUT
