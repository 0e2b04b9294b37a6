#!/usr/bin/env bash
# GPU run 63 (stop 43): bucketed decode graphs (decoding by heads, varlen decode extents) and split-KV
# paged decoding, both switched on, over the tests they touch; then the paged and decode-length benchmarks.
set -u
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }  # after each stage: a cut run still returns one archive
STRIDEDFA_DECODE_GRAPHS=bucketed STRIDEDFA_SPLIT_KV=auto PART=files LIMIT=270 \
  FILES="test_decode_graphs.py test_split_kv.py test_paged.py test_paged_adapters.py test_sinks_decode.py test_flash_attn_interface.py test_varlen.py" \
  bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"; pack
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/paged/paged.json"))
for r in d["rows"]:
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k in (
        "batch", "cache_length", "stridedfa_paged_us", "stridedfa_split_us", "torch_sdpa_gathered_us",
        "share_of_ceiling", "split_share_of_ceiling", "split_speedup_vs_sdpa", "error")})
print(d.get("issue 33 item 2 (split rows)"))
PY
STRIDEDFA_DECODE_GRAPHS=bucketed timeout 90 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14; tail -3 $OUT/decode.log
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
