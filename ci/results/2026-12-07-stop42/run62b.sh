#!/usr/bin/env bash
# GPU run 62, command 2: generation (issue 33 item 4: dynamic cache for five models, static for llama), then host time.
set -u
repo=$(pwd)
site=/tmp/sfa-gen; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
STRIDEDFA_DECODE_GRAPHS=bucketed timeout 200 python3 benchmarks/bench_transformers.py --out $OUT/gen-dynamic --generate --no-training --hidden 1024 --caches dynamic --models llama,qwen3,mistral,gemma2,gpt_oss > $OUT/gen-dynamic.log 2>&1; echo "gen dynamic rc $?"; grep -E "^\|" $OUT/gen-dynamic.log | tail -8; grep -E "Error|error" $OUT/gen-dynamic.log | tail -3
STRIDEDFA_DECODE_GRAPHS=exact timeout 100 python3 benchmarks/bench_transformers.py --out $OUT/gen-dynamic-exact --generate --no-training --hidden 1024 --caches dynamic --models llama,gemma2 > $OUT/gen-dynamic-exact.log 2>&1; echo "gen dynamic exact rc $?"; grep -E "^\|" $OUT/gen-dynamic-exact.log | tail -4
STRIDEDFA_DECODE_GRAPHS=bucketed timeout 170 python3 benchmarks/bench_transformers.py --out $OUT/gen-static --generate --no-training --hidden 1024 --caches static --models llama > $OUT/gen-static.log 2>&1; echo "gen static rc $?"; grep -E "^\|" $OUT/gen-static.log | tail -3
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
