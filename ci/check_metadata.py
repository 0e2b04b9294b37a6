#!/usr/bin/env python3
"""Packaging metadata consistency, read from files (nothing is built): exit 1 naming each problem.

    python ci/check_metadata.py [--root REPO]

1. The version has one source: src/stridedfa/_version.py. pyproject.toml declares it dynamic and
   reads it there (scikit-build-core's regex provider); stridedfa/__init__.py imports it.
2. ci/matrix.yml is valid and expands for every job kind (ci/matrix.py), its Pythons satisfy
   requires-python, the lowest one is requires-python's
   lower bound (the oldest supported CPython is built and tested), and any per-version
   `Programming Language :: Python :: 3.N` classifiers list exactly the matrix's Pythons.
3. Every CUDA major in ci/matrix.yml is one the build supports: pyproject.toml, or the in-tree build
   backend it names (build-system.backend-path), mentions cu<N> (e.g. nvidia-cudnn-cu<N>,
   stridedfa-cu<N>); with more than one major, the build reads STRIDEDFA_CUDA_MAJOR.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matrix  # noqa: E402  (ci/matrix.py)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def check_version(root: Path, pyproject: dict) -> list[str]:
    problems = []
    version_file = root / "src/stridedfa/_version.py"
    try:
        tree = ast.parse(version_file.read_text())
        values = [node.value.value for node in tree.body
                  if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                  and any(getattr(t, "id", None) == "__version__" for t in node.targets)]
    except (OSError, SyntaxError) as error:
        return [f"{version_file}: cannot read __version__ ({error})"]
    if len(values) != 1 or not re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", str(values[0])):
        problems.append(f"{version_file}: expected one `__version__ = \"X.Y.Z\"` line, found {values}")
    project = pyproject.get("project", {})
    if "version" in project:
        problems.append(f"pyproject.toml: [project] sets version = {project['version']!r}; "
                        f"it must be dynamic, read from src/stridedfa/_version.py")
    if "version" not in project.get("dynamic", []):
        problems.append("pyproject.toml: [project] dynamic does not list \"version\"")
    meta = pyproject.get("tool", {}).get("scikit-build", {}).get("metadata", {}).get("version", {})
    if meta.get("provider") != "scikit_build_core.metadata.regex" or meta.get("input") != "src/stridedfa/_version.py":
        problems.append("pyproject.toml: [tool.scikit-build] metadata.version must use provider "
                        "scikit_build_core.metadata.regex with input src/stridedfa/_version.py, "
                        f"found {meta}")
    init = root / "src/stridedfa/__init__.py"
    if "from stridedfa._version import __version__" not in init.read_text():
        problems.append(f"{init}: does not import __version__ from stridedfa._version")
    return problems


def check_pythons(pyproject: dict, pythons: list[str]) -> list[str]:
    problems = []
    project = pyproject.get("project", {})
    requires = project.get("requires-python", "")
    lower = None
    for clause in filter(None, (c.strip() for c in requires.split(","))):
        m = re.fullmatch(r"(>=|<|!=|==|<=|>)\s*(\d+(?:\.\d+)*)(\.\*)?", clause)
        if not m:
            problems.append(f"pyproject.toml: requires-python clause {clause!r} is not understood here")
            continue
        op, bound = m.group(1), _version_tuple(m.group(2))
        if op == ">=":
            lower = bound
        for py in pythons:
            v = _version_tuple(py)
            n = len(bound)
            ok = {">=": v >= bound, ">": v[:n] > bound, "<": v < bound, "<=": v[:n] <= bound,
                  "==": v[:n] == bound, "!=": v[:n] != bound}[op]
            if not ok:
                problems.append(f"ci/matrix.yml: python {py} does not satisfy requires-python {requires!r}")
    if lower is None:
        problems.append(f"pyproject.toml: requires-python {requires!r} has no >= lower bound")
    elif min(map(_version_tuple, pythons)) != lower[:2]:
        problems.append(f"ci/matrix.yml: lowest python {min(pythons, key=_version_tuple)} is not "
                        f"requires-python's lower bound {requires!r}: the oldest supported CPython "
                        f"must be built and tested")
    classified = sorted(c.rsplit("::", 1)[1].strip() for c in project.get("classifiers", [])
                        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    if classified and sorted(classified, key=_version_tuple) != sorted(pythons, key=_version_tuple):
        problems.append(f"pyproject.toml: Python classifiers {classified} differ from ci/matrix.yml {pythons}")
    return problems


def build_config_text(root: Path, pyproject: dict) -> str:
    """pyproject.toml plus every Python file of an in-tree build backend."""
    texts = [(root / "pyproject.toml").read_text()]
    for entry in pyproject.get("build-system", {}).get("backend-path", []):
        path = root / entry
        texts += [p.read_text() for p in sorted(path.rglob("*.py"))] if path.is_dir() else []
    return "\n".join(texts)


def check_cuda_majors(root: Path, pyproject: dict, majors: list[int]) -> list[str]:
    text = build_config_text(root, pyproject)
    problems = [f"ci/matrix.yml: builds CUDA {n}, but neither pyproject.toml nor an in-tree build "
                f"backend mentions cu{n} (e.g. nvidia-cudnn-cu{n}): the build does not support it"
                for n in majors if not re.search(rf"(?<![0-9a-z])cu{n}(?![0-9])", text)]
    if len(majors) > 1 and "STRIDEDFA_CUDA_MAJOR" not in text:
        problems.append(f"ci/matrix.yml: builds CUDA majors {majors}, but the build (pyproject.toml, "
                        f"in-tree backend) never reads STRIDEDFA_CUDA_MAJOR, so every build is the same")
    return problems


def check(root: Path) -> list[str]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    try:
        data = matrix.load(root / "ci/matrix.yml")
        for kind in matrix.KINDS:
            print(f"matrix {kind}: {len(matrix.expand(data, kind)['include'])} cells")
    except matrix.MatrixError as error:
        return [str(error)]
    return (check_version(root, pyproject)
            + check_pythons(pyproject, data["wheels"]["python"])
            + check_cuda_majors(root, pyproject, data["wheels"]["cuda_major"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="repository root (default: this checkout)")
    args = parser.parse_args(argv)
    problems = check(args.root)
    for problem in problems:
        print(f"ci/check_metadata.py: {problem}", file=sys.stderr)
    if not problems:
        print("packaging metadata: consistent")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
