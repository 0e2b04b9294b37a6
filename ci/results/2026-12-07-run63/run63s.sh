#!/usr/bin/env bash
# GPU run 63, short form (~4 min, for little device time): the two new tests files with both switches
# on, then the paged benchmark's quick rows (split and unsplit beside SDPA).
set -u
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }  # after each stage: a cut run still returns one archive
STRIDEDFA_DECODE_GRAPHS=bucketed STRIDEDFA_SPLIT_KV=auto PART=files LIMIT=150 \
  FILES="test_decode_graphs.py test_split_kv.py" bash ci/gpu_suite.sh
export PYTHONPATH=/tmp/sfa-files PYTHONUNBUFFERED=1
timeout 80 python3 benchmarks/bench_paged.py --out $OUT/paged --quick > $OUT/paged.log 2>&1; echo "paged bench rc $?"; pack
grep -E '"(batch|cache_length|queries|stridedfa_paged_us|stridedfa_split_us|torch_sdpa_gathered_us|split_share_of_ceiling)"' $OUT/paged/paged.json | tr -d ' \n' | sed 's/"batch"/\n"batch"/g'; echo
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
