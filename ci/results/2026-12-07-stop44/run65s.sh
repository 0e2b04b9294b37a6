#!/usr/bin/env bash
# GPU run 65, short form (stop 44, ~5 min): probes first (probe65: a dense cache as paged blocks;
# probe64: the unmasked one-query steps), then the tests the unmasking touches.
set -u
repo=$(pwd)
pack() { (cd "$OUT" && tar czf /tmp/r.tgz --exclude=r.tgz . && mv /tmp/r.tgz r.tgz); }
site=/tmp/sfa-files; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
export PYTHONPATH=$site PYTHONUNBUFFERED=1
(cd /tmp && timeout 50 python3 $repo/ci/results/2026-12-07-stop44/probe65.py > $OUT/probe65.log 2>&1); echo "probe65 rc $?"; cut -c1-700 $OUT/probe65.log; pack
(cd /tmp && timeout 40 python3 $repo/ci/results/2026-12-07-run64/probe64.py > $OUT/probe64.log 2>&1); echo "probe64 rc $?"; cut -c1-400 $OUT/probe64.log; pack
(cd tests/gpu && timeout 150 python3 -m pytest -p no:cacheprovider -q -rfEs --tb=short -o cache_dir=/tmp/.c \
  test_decode_graphs.py test_paged.py test_variants.py test_bitexact.py test_flash_attn_interface.py test_sinks_decode.py > $OUT/files.log 2>&1); echo "tests rc $?"; tail -1 $OUT/files.log; grep -E "^(FAILED|ERROR)" $OUT/files.log | head; pack
ls $OUT
