#!/usr/bin/env bash
# The GPU benchmarks still to run (ci/next-gpu-session.md), one `run` command on a lent device host
# (ci/gpu_host.md), carrying the wheel in .whl/ (built by ci/build_wheel_for_gpu_host.sh); the
# working tree's Python files are copied over the wheel's:
#   bash ci/gpu_bench.sh    bench_host_overhead, bench_cold_start, bench_varlen
#                           (issue 9, issue 14 (b), issue 12 (a)), ~7 minutes
# Each benchmark writes under $OUT (host/, cold/, varlen/); commit its files as
# benchmarks/results/README.md says. Persisted plans go to $OUT/plans-bench, so that what cold start
# reports as build time is build time. This is the `bench` part of run53.sh, prepared for GPU run 53
# (`git show 62553a9^:ci/results/next/run53.sh`); its other parts, the suite and the stride fuzz,
# are ci/gpu_suite.sh's.
set -u
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export STRIDEDFA_CACHE_DIR=$OUT/plans-bench
mkdir -p /tmp/w && cd /tmp/w || exit 3
timeout 150 python3 "$repo/benchmarks/bench_host_overhead.py" --out "$OUT/host" > "$OUT/host.log" 2>&1
echo "host rc $?"; sed -n '/^| path/,/^$/p' "$OUT"/host/*.md 2>/dev/null | head -40
timeout 300 python3 "$repo/benchmarks/bench_cold_start.py" --out "$OUT/cold" --repeats 3 > "$OUT/cold.log" 2>&1
echo "cold rc $?"; cat "$OUT/cold/bench_cold_start.md" 2>/dev/null
timeout 120 python3 "$repo/benchmarks/bench_varlen.py" --out "$OUT/varlen" > "$OUT/varlen.log" 2>&1
echo "varlen rc $?"
python3 -c "import json; d=json.load(open('$OUT/varlen/varlen.json')); print(d['ms_per_step'], d['vs_documents_alone'], d['targets'])"
