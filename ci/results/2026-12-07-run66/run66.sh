#!/usr/bin/env bash
# GPU run 66 (for the session after stop 44, ~9 min; build the wheel first): the unmasked one-query
# steps and decoding by heads through a paged view (STRIDEDFA_DECODE_GRAPHS=paged, whose GPU tests
# turn it on themselves), probe65 (the same view through the public API), probe66 (multi-token
# decoding by tokens), then bench_decode_lengths
# with the ragged and the paged form, and bench_paged.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }
PART=files LIMIT=210 \
  FILES="test_decode_graphs.py test_paged.py test_variants.py test_bitexact.py test_flash_attn_interface.py test_sinks_decode.py test_empty_sequences.py test_split_kv.py" \
  bash ci/gpu_suite.sh
pack
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
(cd /tmp && timeout 45 python3 $repo/ci/results/2026-12-07-run66/probe65.py > $OUT/probe65.log 2>&1); echo "probe65 rc $?"; cut -c1-700 $OUT/probe65.log; pack
(cd /tmp && timeout 40 python3 $repo/ci/results/2026-12-07-run66/probe66.py > $OUT/probe66.log 2>&1); echo "probe66 rc $?"; cut -c1-400 $OUT/probe66.log; pack
timeout 80 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode --quick > $OUT/decode.log 2>&1; echo "decode (ragged by heads) rc $?"; grep -E "^\|" $OUT/decode.log | tail -9; pack
timeout 80 python3 benchmarks/bench_decode_lengths.py --out $OUT/decode-paged --quick --heads-paged > $OUT/decode-paged.log 2>&1; echo "decode (paged by heads) rc $?"; grep -E "^\||graphs built" $OUT/decode-paged.log | tail -11; pack
timeout 80 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"; grep -A4 "issue 33 item 2" $OUT/paged.log; pack; ls $OUT
