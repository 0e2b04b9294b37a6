# shellcheck shell=bash
# Shared helpers of the ci/ scripts (sourced, not run).

# find_wheel PATH: prints the .whl PATH names, or the one .whl inside the folder PATH.
find_wheel() {
  local path=$1 found
  if [ -z "$path" ]; then echo "$0: --wheel PATH is required (see --help)" >&2; return 2; fi
  if [ -d "$path" ]; then
    found=$(find "$path" -maxdepth 1 -type f -name '*.whl' | sort)
    if [ "$(printf '%s' "$found" | grep -c .)" != 1 ]; then
      echo "$0: $path holds $(printf '%s' "$found" | grep -c .) wheels, expected one" >&2; return 2
    fi
    path=$found
  fi
  case "$path" in *.whl) ;; *) echo "$0: $path is not a .whl file" >&2; return 2 ;; esac
  if [ ! -f "$path" ]; then echo "$0: no wheel at $path" >&2; return 2; fi
  (cd "$(dirname "$path")" && echo "$(pwd)/$(basename "$path")")
}
