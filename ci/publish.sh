#!/usr/bin/env bash
# Publishes the wheels in DIR to PyPI: `twine check --strict` on every file, then `twine upload`.
#
#   ci/publish.sh --dist DIR [--repository pypi|testpypi] [--dry-run]
#
# Credentials are twine's own: with neither TWINE_USERNAME nor TWINE_PASSWORD set, twine (>= 6.1)
# uses PyPI trusted publishing from GitHub Actions (the job needs `id-token: write`); otherwise
# TWINE_USERNAME=__token__ and TWINE_PASSWORD=<API token>. --dry-run checks and prints the upload
# command without running it. Every file must be a stridedfa-cu<N> wheel of one version.
# Conda packages are not uploaded here (see .github/workflows/ci.yml, job publish).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

dist="" repository=pypi dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dist) dist=${2:?--dist needs a value}; shift 2 ;;
    --repository) repository=${2:?--repository needs a value}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "ci/publish.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$repository" in pypi|testpypi) ;; *) echo "ci/publish.sh: --repository must be pypi or testpypi" >&2; exit 2 ;; esac
[ -d "$dist" ] || { echo "ci/publish.sh: --dist DIR is required and must be a folder" >&2; exit 2; }

shopt -s nullglob
files=("$dist"/*)
[ "${#files[@]}" -gt 0 ] || { echo "ci/publish.sh: $dist is empty" >&2; exit 1; }
versions=""
for f in "${files[@]}"; do
  name=$(basename "$f")
  if ! [[ "$name" =~ ^stridedfa_cu(12|13)-([^-]+)-.*\.whl$ ]]; then
    echo "ci/publish.sh: $name is not a stridedfa-cu12/cu13 wheel" >&2; exit 1
  fi
  versions=$(printf '%s\n%s' "$versions" "${BASH_REMATCH[2]}" | sed '/^$/d' | sort -u)
done
if [ "$(printf '%s\n' "$versions" | wc -l)" != 1 ]; then
  echo "ci/publish.sh: more than one version in $dist: $(echo "$versions" | tr '\n' ' ')" >&2; exit 1
fi
echo "publishing ${#files[@]} file(s) of version $versions to $repository"

command -v twine >/dev/null || { echo "ci/publish.sh: twine not found (pip install 'twine>=6.1')" >&2; exit 2; }
twine check --strict "${files[@]}"
upload=(twine upload --non-interactive --repository "$repository" "${files[@]}")
if [ "$dry_run" = 1 ]; then
  echo "dry run, would run: ${upload[*]}"
else
  "${upload[@]}"
fi
