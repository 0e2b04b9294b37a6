#!/usr/bin/env python3
"""Expand ci/matrix.yml into the GitHub Actions `strategy.matrix` of one job kind.

    python ci/matrix.py wheels|conda|cpu-tests|gpu-tests [--file ci/matrix.yml] [--pretty]
    python ci/matrix.py --check          # validate only

Prints {"include": [cell, ...]} as JSON; ci.yml reads it with fromJSON. Every cell names the
runner it needs (`runner`: a label or a list of labels) and the wheel artifact it builds or uses,
so the workflow derives nothing itself. An unknown key or value is an error that names it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MATRIX_FILE = Path(__file__).resolve().parent / "matrix.yml"
KINDS = ("wheels", "conda", "cpu-tests", "gpu-tests")
ARCHS = ("x86_64", "aarch64")
CUDA_MAJORS = (12, 13)
CONDA_CUDA = ("12.9", "13.0")
CONDA_SUBDIR = {"x86_64": "linux-64", "aarch64": "linux-aarch64"}
TOP_KEYS = {"runners", "wheels", "conda", "cpu_tests", "gpu_tests"}


class MatrixError(ValueError):
    pass


def _fail(where: str, message: str):
    raise MatrixError(f"{where}: {message}")


def _check_keys(where: str, mapping, required: set[str], optional: set[str] = frozenset()) -> None:
    if not isinstance(mapping, dict):
        _fail(where, f"expected a mapping, got {type(mapping).__name__}")
    allowed = required | optional
    unknown = sorted(set(mapping) - allowed)
    missing = sorted(required - set(mapping))
    if unknown:
        _fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    if missing:
        _fail(where, f"missing key(s) {missing}")


def _check_list(where: str, values, check_one) -> list:
    if not isinstance(values, list) or not values:
        _fail(where, "expected a non-empty list")
    if len(set(map(repr, values))) != len(values):
        _fail(where, f"duplicate values in {values}")
    for value in values:
        check_one(where, value)
    return values


def _cuda_major(where, value):
    if type(value) is not int or value not in CUDA_MAJORS:
        _fail(where, f"cuda_major {value!r} is not one of {list(CUDA_MAJORS)}")


def _arch(where, value):
    if value not in ARCHS:
        _fail(where, f"arch {value!r} is not one of {list(ARCHS)}")


def _python(where, value):
    # A string on purpose: YAML reads 3.10 as the float 3.1.
    parts = value.split(".") if isinstance(value, str) else []
    if len(parts) != 2 or parts[0] != "3" or not parts[1].isdigit():
        _fail(where, f"python {value!r} must be a quoted \"3.N\" string")


def _conda_cuda(where, value):
    if value not in CONDA_CUDA:
        _fail(where, f"cuda {value!r} is not one of {list(CONDA_CUDA)} (quote it: \"12.9\")")


def load(path: Path = MATRIX_FILE) -> dict:
    """Read and validate the matrix file; raise MatrixError naming the first problem."""
    import yaml  # PyYAML: the `test` extra

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise MatrixError(f"{path}: not valid YAML: {error}") from None
    _check_keys(str(path), data, TOP_KEYS)

    _check_keys("runners", data["runners"], set(ARCHS))
    for arch, label in data["runners"].items():
        if not isinstance(label, str) or not label:
            _fail(f"runners.{arch}", f"expected a runner label, got {label!r}")

    wheels = data["wheels"]
    _check_keys("wheels", wheels, {"cuda_major", "arch", "python"})
    _check_list("wheels.cuda_major", wheels["cuda_major"], _cuda_major)
    _check_list("wheels.arch", wheels["arch"], _arch)
    _check_list("wheels.python", wheels["python"], _python)

    conda = data["conda"]
    _check_keys("conda", conda, {"cuda", "arch"})
    _check_list("conda.cuda", conda["cuda"], _conda_cuda)
    _check_list("conda.arch", conda["arch"], _arch)

    built = {(c, a, p) for c in wheels["cuda_major"] for a in wheels["arch"] for p in wheels["python"]}
    for kind, extra in (("cpu_tests", set()), ("gpu_tests", {"runner", "with", "pip_extra_index_url"})):
        cells = data[kind]
        if not isinstance(cells, list) or not cells:
            _fail(kind, "expected a non-empty list of cells")
        seen = set()
        for i, cell in enumerate(cells):
            where = f"{kind}[{i}]"
            _check_keys(where, cell, {"cuda_major", "arch", "python"}, optional=extra)
            _cuda_major(where, cell["cuda_major"])
            _arch(where, cell["arch"])
            _python(where, cell["python"])
            key = (cell["cuda_major"], cell["arch"], cell["python"])
            if key not in built:
                _fail(where, f"tests a wheel the wheels matrix does not build: {cell}")
            if key in seen:
                _fail(where, f"duplicate cell {cell}")
            seen.add(key)
            if "runner" in cell:
                labels = cell["runner"]
                if (not isinstance(labels, list) or not labels
                        or not all(isinstance(x, str) and x for x in labels)):
                    _fail(f"{where}.runner", f"expected a list of runner labels, got {labels!r}")
                if "self-hosted" not in labels:
                    _fail(f"{where}.runner", "GPU jobs run on self-hosted runners: add 'self-hosted'")
            if "with" in cell:
                requirements = cell["with"]
                if not isinstance(requirements, list) or not all(
                        isinstance(r, str) and r and " " not in r for r in requirements):
                    _fail(f"{where}.with", f"expected a list of requirements without spaces, got {requirements!r}")
            if "pip_extra_index_url" in cell:
                url = cell["pip_extra_index_url"]
                if not isinstance(url, str) or not url.startswith("https://") or " " in url:
                    _fail(f"{where}.pip_extra_index_url", f"expected an https:// URL, got {url!r}")
    return data


def wheel_artifact(cuda_major: int, arch: str, python: str) -> str:
    return f"wheel-cu{cuda_major}-{arch}-py{python}"


def _wheel_cell(data: dict, cuda_major: int, arch: str, python: str, runner=None) -> dict:
    return {
        "cuda_major": cuda_major,
        "arch": arch,
        "python": python,
        "runner": runner if runner is not None else data["runners"][arch],
        "artifact": wheel_artifact(cuda_major, arch, python),
    }


def expand(data: dict, kind: str) -> dict:
    """The strategy.matrix of one job kind: {"include": [cell, ...]}."""
    if kind == "wheels":
        w = data["wheels"]
        cells = [_wheel_cell(data, c, a, p)
                 for c in w["cuda_major"] for a in w["arch"] for p in w["python"]]
    elif kind == "conda":
        cells = [{"cuda": cuda, "arch": arch, "subdir": CONDA_SUBDIR[arch],
                  "runner": data["runners"][arch],
                  "artifact": f"conda-cuda{cuda}-{CONDA_SUBDIR[arch]}"}
                 for cuda in data["conda"]["cuda"] for arch in data["conda"]["arch"]]
    elif kind == "cpu-tests":
        cells = [_wheel_cell(data, c["cuda_major"], c["arch"], c["python"])
                 for c in data["cpu_tests"]]
    elif kind == "gpu-tests":
        cells = [dict(_wheel_cell(data, c["cuda_major"], c["arch"], c["python"], c["runner"]),
                      with_args=" ".join(f"--with {r}" for r in c.get("with", [])),
                      pip_extra_index_url=c.get("pip_extra_index_url", ""))
                 for c in data["gpu_tests"]]
    else:
        raise MatrixError(f"unknown job kind {kind!r}; one of {list(KINDS)}")
    return {"include": cells}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", nargs="?", choices=KINDS, help="the job kind to expand")
    parser.add_argument("--file", type=Path, default=MATRIX_FILE, help="matrix file (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="validate the file and print nothing")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    args = parser.parse_args(argv)
    if not args.check and args.kind is None:
        parser.error("give a job kind or --check")
    try:
        data = load(args.file)
        result = None if args.check else expand(data, args.kind)
    except MatrixError as error:
        print(f"ci/matrix.py: {error}", file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2 if args.pretty else None, separators=None if args.pretty else (",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
