#!/usr/bin/env bash
# GPU run 62, command 1: the tests decoding by heads touches, the decode-length benchmark, the probe.
set -u
PART=files LIMIT=${LIMIT:-230} FILES="test_decode_graphs.py test_sinks_decode.py test_flash_attn_interface.py test_paged.py test_empty_sequences.py test_paged_adapters.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 120 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14
(cd tests/gpu && timeout 90 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short test_transformers.py -k "generat or static or decod" -o cache_dir=/tmp/.c) > $OUT/transformers_gen.log 2>&1; echo "transformers gen rc $?"; tail -2 $OUT/transformers_gen.log; grep -E "^(FAILED|ERROR)" $OUT/transformers_gen.log | head
timeout 70 python3 ci/results/2026-12-07-stop42/probe33.py $OUT/probe_heads.json > $OUT/probe_heads.log 2>&1; echo "probe rc $?"
python3 - <<'PY'
import json, os
try:
    d = json.load(open(os.environ["OUT"] + "/probe_heads.json"))
    print(d["cudnn"], d["device"], d["loop"])
    for r in d["rows"]:
        print(" ", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k.endswith(("_us", "builds", "bitexact", "maxdiff", "error")) or k in ("b", "L")})
except Exception as e:
    print("probe", e)
PY
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
