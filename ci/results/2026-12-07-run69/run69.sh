#!/usr/bin/env bash
# GPU run 69 (~7 min; build the wheel first): probe69 first (a decoding call's host time beside
# SDPA; the tail of a prefix + tail split), then the test files of every path with launch scratch (the
# launch's scratch now lies in the call's workspace; the paged view's lengths come from its table
# kernel; wide windows decode unmasked), then memcheck over the decoding, split and sinks paths.
# One all.tgz back, packed after every step.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
site=/tmp/sfa-probe
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl && cp src/stridedfa/*.py "$site/stridedfa/"
(cd /tmp && PYTHONPATH=$site PYTHONUNBUFFERED=1 timeout 100 python3 "$repo/ci/results/2026-12-07-run69/probe69.py" \
  > "$OUT/probe69.log" 2>&1); echo "probe69 rc $?"
cut -c1-700 "$OUT/probe69.log"; pack
PART=files LIMIT=230 FILES="test_decode_graphs.py test_decode_by_tokens.py test_paged.py test_split_kv.py \
  test_sinks_decode.py test_varlen.py test_empty_sequences.py test_cudnn_quirks.py test_torch_compile.py test_jax.py \
  test_paged_adapters.py" bash ci/gpu_suite.sh; pack
(cd tests/gpu && PYTHONPATH=/tmp/sfa-files timeout 70 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest \
  -p no:cacheprovider -q -o cache_dir=/tmp/.c test_decode_by_tokens.py test_split_kv.py test_sinks_decode.py \
  test_decode_graphs.py -k "not random_strides and not loop" > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
cd "$OUT" && find . -type f ! -name all.tgz -delete; ls "$OUT"
