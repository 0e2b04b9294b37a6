#!/usr/bin/env bash
# Issue 31 item 8's "before and after" on ONE card in one `run` command: the host, throughput and
# variant benchmarks on the wheel of 7e6f910 (before the one-call-path redesign; built into .whl0/)
# and on main's (.whl/), each wheel with its own Python files (nothing copied over them), the host
# benchmark twice in alternation so that drift hits both. The benchmark scripts are the same at
# both commits. Carry .whl and .whl0 (both built by ci/build_wheel_for_gpu_host.sh at their commits).
#   PART=host bash ci/gpu_compare.sh         the host benchmark, 2 rounds x 2 wheels (~5 minutes)
#   PART=throughput bash ci/gpu_compare.sh   bench_attention --quick and bench_variants --quick
# Everything goes under $OUT/before and $OUT/after; record it as benchmarks/results/README.md says.
set -u
: "${PART:?set PART=host or throughput}"
ls .whl0/*.whl .whl/*.whl || exit 3
repo=$(pwd)
for side in before after; do
  if [ "$side" = before ]; then wheels=(.whl0/*.whl); else wheels=(.whl/*.whl); fi
  rm -rf "/tmp/sfa-$side" && python3 -m pip install -q --no-index --no-deps --no-compile --target "/tmp/sfa-$side" \
    "${wheels[@]}"
done
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/env.txt"
mkdir -p /tmp/w && cd /tmp/w || exit 3
bench() {  # side, name, timeout, script and arguments
  local side=$1 name=$2 limit=$3; shift 3
  mkdir -p "$OUT/$side"
  PYTHONPATH="/tmp/sfa-$side" STRIDEDFA_CACHE_DIR="$OUT/plans-$side" timeout "$limit" \
    python3 "$repo/benchmarks/$1" "${@:2}" --out "$OUT/$side/$name" > "$OUT/$side/$name.log" 2>&1
  echo "$side $name rc $?"
}
if [ "$PART" = host ]; then
  for round in 1 2; do
    for side in before after; do bench "$side" "host$round" 130 bench_host_overhead.py --quick; done
  done
  for side in before after; do
    echo "== $side"; sed -n '/^| path/,/^$/p' "$OUT/$side"/host2/*.md 2>/dev/null | head -30
  done
else
  for side in before after; do
    bench "$side" attention 140 bench_attention.py --quick
    bench "$side" variants 130 bench_variants.py --quick
  done
fi
rm -rf "$OUT"/plans-*
