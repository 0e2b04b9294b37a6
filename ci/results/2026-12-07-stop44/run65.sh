#!/usr/bin/env bash
# GPU run 65 (stop 44): one-query decoding steps unmasked (call_plan.cpp one_row_sees_every_key) and
# split-KV off by default: the decoding, paged, variant and bit-exactness tests; then bench_paged,
# probe64.py (the mask's cost, on this card), probe65.py (a dense cache as paged blocks) and bench_decode_lengths.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }
PART=files LIMIT=230 \
  FILES="test_decode_graphs.py test_split_kv.py test_paged.py test_paged_adapters.py test_sinks_decode.py test_flash_attn_interface.py test_variants.py test_bitexact.py test_empty_sequences.py test_gpu_cache.py" \
  bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 100 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"; pack
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/paged/paged.json"))
r3 = lambda v: round(v, 1) if isinstance(v, float) else v
for r in d["rows"]:
    g = r.get("graphed", {})
    print(r["batch"], r["cache_length"], r.get("queries"), "eager", r3(r.get("stridedfa_paged_us")), r3(r.get("stridedfa_split_us")),
          r3(r.get("torch_sdpa_gathered_us")), "graphed", r3(g.get("stridedfa_paged_us")), r3(g.get("stridedfa_split_us")),
          r3(g.get("torch_sdpa_gathered_us")), r3(g.get("share_of_ceiling")), r.get("error", ""))
print({k: v for k, v in d.items() if k.startswith("issue")})
PY
(cd /tmp && timeout 50 python3 $repo/ci/results/2026-12-07-run64/probe64.py > $OUT/probe64.log 2>&1); echo "probe rc $?"; cat $OUT/probe64.log | cut -c1-400; pack
(cd /tmp && timeout 50 python3 $repo/ci/results/2026-12-07-stop44/probe65.py > $OUT/probe65.log 2>&1); echo "probe65 rc $?"; cut -c1-600 $OUT/probe65.log; pack
timeout 80 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14
pack; ls $OUT
