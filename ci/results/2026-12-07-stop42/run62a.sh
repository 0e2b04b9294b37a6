#!/usr/bin/env bash
# GPU run 62, command 1: the files decoding by heads touches, plus the decode probe (exact vs by heads).
set -u
repo=$(pwd)
PART=files LIMIT=${LIMIT:-420} FILES="test_decode_graphs.py test_sinks_decode.py test_flash_attn_interface.py test_empty_sequences.py test_gpu_cache.py test_bitexact.py test_torch_attention.py test_variants.py test_paged.py" bash ci/gpu_suite.sh
(cd tests/gpu && PYTHONPATH=/tmp/sfa-files timeout 100 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short test_transformers.py -k "generat or static or decod" -o cache_dir=/tmp/.c) > $OUT/transformers_gen.log 2>&1; echo "transformers gen rc $?"; tail -2 $OUT/transformers_gen.log; grep -E "^(FAILED|ERROR)" $OUT/transformers_gen.log | head
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
STRIDEDFA_DECODE_BY_HEADS=0 timeout 80 python3 ci/results/2026-12-07-stop42/probe33.py $OUT/probe_exact.json > $OUT/probe_exact.log 2>&1; echo "probe exact rc $?"
timeout 80 python3 ci/results/2026-12-07-stop42/probe33.py $OUT/probe_heads.json > $OUT/probe_heads.log 2>&1; echo "probe heads rc $?"
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for name in ("exact", "heads"):
    try: d = json.load(open(f"{o}/probe_{name}.json"))
    except Exception as e: print(name, e); continue
    print(name, d["cudnn"], d["device"], d["loop"])
    for r in d["rows"]:
        print(" ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k.endswith(("_us", "builds", "first_ms", "bitexact", "maxdiff", "err", "error")) or k in ("b", "L")})
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
