#!/usr/bin/env bash
# GPU run 64, command 1 (stop 44): with bucketed decode graphs and split-KV now the defaults, the test
# files decoding touches; then bench_paged (back to back and CUDA-graph replayed; the chunk sweep
# behind split_kv.cpp's heuristic) and bench_decode_lengths.
set -u
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }  # a cut run still returns one archive
PART=files LIMIT=250 \
  FILES="test_decode_graphs.py test_split_kv.py test_paged.py test_paged_adapters.py test_sinks_decode.py test_flash_attn_interface.py test_varlen.py test_empty_sequences.py" \
  bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 210 python3 benchmarks/bench_paged.py --out $OUT/paged --quick --sweep-chunks > $OUT/paged.log 2>&1; echo "paged bench rc $?"; pack
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/paged/paged.json"))
r3 = lambda v: round(v, 1) if isinstance(v, float) else v
for r in d["rows"]:
    g = r.get("graphed", {})
    print(r["batch"], r["cache_length"], r.get("queries"), "eager", r3(r.get("stridedfa_paged_us")), r3(r.get("stridedfa_split_us")),
          r3(r.get("torch_sdpa_gathered_us")), "graphed", r3(g.get("stridedfa_paged_us")), r3(g.get("stridedfa_split_us")),
          r3(g.get("torch_sdpa_gathered_us")), r3(g.get("share_of_ceiling")), r.get("error", ""))
for e in d.get("chunk_sweep", []):
    print("sweep", e["batch"], e["cache_length"], {k: r3(v) for k, v in e["us_by_chunks"].items()}, "heuristic", r3(e["heuristic_us"]))
PY
timeout 90 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode bench rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -14; tail -3 $OUT/decode.log
pack; ls $OUT
