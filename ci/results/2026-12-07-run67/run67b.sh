#!/usr/bin/env bash
# GPU run 67, command 3 (~3 min): the decoding-by-tokens tests again (the first pass gave a paged
# call without seqlens_kv, which validation refuses), memcheck over them, and bench_decode_lengths
# on the library's default (the paged view; its --ragged flag replaced --heads-paged).
set -u
pack() { (cd "$OUT" && tar czf /tmp/all.tgz --exclude=all.tgz . && mv /tmp/all.tgz all.tgz); }
PART=files LIMIT=90 FILES="test_decode_by_tokens.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd tests/gpu && timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -p no:cacheprovider \
  -q -o cache_dir=/tmp/.c test_decode_by_tokens.py > $OUT/memcheck.log 2>&1)
echo "memcheck rc $? (9: memcheck found errors)"; grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | tail -3; pack
timeout 80 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode lengths rc $?"; grep -E "^\||graphs built" $OUT/decode.log | tail -11
pack; cd $OUT && find . -type f ! -name all.tgz -delete; ls $OUT
