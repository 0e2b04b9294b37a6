#!/usr/bin/env bash
# GPU run 67, command 2 (~6 min): generation (issue 33 item 4) with the paged view by heads as the
# default: the dynamic cache for five models, llama's static cache. One all.tgz back.
set -u
site=/tmp/sfa-gen; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
timeout 220 python3 benchmarks/bench_transformers.py --out $OUT/gen-dynamic --generate --no-training --hidden 1024 --caches dynamic --models llama,qwen3,mistral,gemma2,gpt_oss > $OUT/gen-dynamic.log 2>&1; echo "gen dynamic rc $?"; grep -E "^\|" $OUT/gen-dynamic.log | tail -8; grep -E "Error|error" $OUT/gen-dynamic.log | tail -3; pack
timeout 170 python3 benchmarks/bench_transformers.py --out $OUT/gen-static --generate --no-training --hidden 1024 --caches static --models llama > $OUT/gen-static.log 2>&1; echo "gen static rc $?"; grep -E "^\|" $OUT/gen-static.log | tail -4
pack; cd $OUT && find . -type f ! -name all.tgz -delete; ls $OUT
