#!/usr/bin/env bash
# GPU benchmarks, one `run` command per part on a lent device host (ci/gpu_host.md), carrying the
# wheel in .whl/ (built by ci/build_wheel_for_gpu_host.sh); the working tree's Python files are
# copied over the wheel's. What to run first: ci/next-gpu-session.md.
#   PART=host          bench_host_overhead, then bench_call_patterns --quick three times (~4 min)
#   PART=transformers  bench_transformers at hidden 1024 and 2048, full rounds, 8 x 4096 rows (~9 min)
#   PART=compiled      bench_transformers --compile --quick at hidden 1024 (~4 min)
#   PART=cold          bench_cold_start and bench_varlen (~7 min)
# Each writes under $OUT/<part>...; commit the files as benchmarks/results/README.md says.
# Persisted plans go to $OUT/plans-bench, so that what cold start reports as build time is build time.
set -u
: "${PART:?set PART=host, transformers, compiled or cold}"
ls .whl/*.whl || exit 3
repo=$(pwd)
rm -rf /tmp/sfa && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/sfa .whl/*.whl
cp src/stridedfa/*.py /tmp/sfa/stridedfa/
export PYTHONPATH=/tmp/sfa PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export STRIDEDFA_CACHE_DIR=$OUT/plans-bench
mkdir -p /tmp/w && cd /tmp/w || exit 3
bench="$repo/benchmarks"
table() { grep -E "^\||geomean|speedup" "$1" | tail -"${2:-40}"; }
case "$PART" in
  host)
    timeout 150 python3 "$bench/bench_host_overhead.py" --out "$OUT/host" > "$OUT/host.log" 2>&1
    echo "host rc $?"; sed -n '/^| path/,/^$/p' "$OUT"/host/*.md 2>/dev/null | head -40
    grep -E "NOT met|per call is" "$OUT"/host/*.md | cut -c1-220
    for i in 1 2 3; do
      timeout 60 python3 "$bench/bench_call_patterns.py" --out "$OUT/patterns$i" --quick > "$OUT/patterns$i.log" 2>&1
      echo "call patterns $i rc $?"; grep -E "train" "$OUT/patterns$i"/*.md | cut -c1-200 | head -12
    done ;;
  transformers)
    for hidden in 1024 2048; do
      timeout 270 python3 "$bench/bench_transformers.py" --out "$OUT/transformers-h$hidden" --hidden "$hidden" \
        > "$OUT/transformers-h$hidden.log" 2>&1
      echo "transformers hidden $hidden rc $?"; table "$OUT/transformers-h$hidden.log"
    done ;;
  compiled)
    timeout 230 python3 "$bench/bench_transformers.py" --out "$OUT/compiled" --compile --quick --hidden 1024 \
      > "$OUT/compiled.log" 2>&1
    echo "compiled rc $?"; table "$OUT/compiled.log" ;;
  cold)
    timeout 300 python3 "$bench/bench_cold_start.py" --out "$OUT/cold" --repeats 3 > "$OUT/cold.log" 2>&1
    echo "cold rc $?"; cat "$OUT/cold/bench_cold_start.md" 2>/dev/null
    timeout 120 python3 "$bench/bench_varlen.py" --out "$OUT/varlen" > "$OUT/varlen.log" 2>&1
    echo "varlen rc $?"
    python3 -c "import json; d=json.load(open('$OUT/varlen/varlen.json')); print(d['ms_per_step'], d['vs_documents_alone'], d['targets'])" ;;
esac
rm -rf "${OUT:?}/plans-bench"
cd "$OUT" && tar czf results.tgz --exclude=results.tgz . && ls
