#!/usr/bin/env bash
# GPU run 62: issue 32 item 2, every model at hidden 1024 and 2048 (unpadded, right, left; 8 x 4096 for two).
set -u
site=/tmp/sfa-bench; rm -rf $site; python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl; cp src/stridedfa/*.py $site/stridedfa/
export PYTHONPATH=$site PYTHONUNBUFFERED=1
for hidden in ${HIDDENS:-1024 2048}; do
  timeout ${LIMIT:-280} python3 benchmarks/bench_transformers.py --out $OUT/h$hidden --hidden $hidden ${EXTRA:-} > $OUT/h$hidden.log 2>&1; echo "bench $hidden rc $?"; grep -E "^\||geomean|speedup" $OUT/h$hidden.log | tail -40
done
cd $OUT && tar czf r.tgz --exclude=r.tgz . && ls
