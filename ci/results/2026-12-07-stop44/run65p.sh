#!/usr/bin/env bash
# GPU run 65, probes only (stop 44, ~2 min, for the last device minutes): probe65 (a dense cache as
# paged blocks), probe64 (the one-query steps, now unmasked), then the decoding tests while time lasts.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }
site=/tmp/sfa-files; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
export PYTHONPATH=$site PYTHONUNBUFFERED=1
(cd /tmp && timeout 45 python3 $repo/ci/results/2026-12-07-stop44/probe65.py > $OUT/probe65.log 2>&1); echo "probe65 rc $?"; cut -c1-700 $OUT/probe65.log; pack
(cd /tmp && timeout 35 python3 $repo/ci/results/2026-12-07-run64/probe64.py > $OUT/probe64.log 2>&1); echo "probe64 rc $?"; cut -c1-400 $OUT/probe64.log; pack
(cd tests/gpu && timeout 60 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short -o cache_dir=/tmp/.c -x \
  test_decode_graphs.py test_paged.py test_sinks_decode.py > $OUT/files.log 2>&1); echo "tests rc $?"; tail -1 $OUT/files.log; grep -E "^(FAILED|ERROR)" $OUT/files.log | head; pack
