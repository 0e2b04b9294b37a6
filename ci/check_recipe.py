#!/usr/bin/env python3
"""Offline check of the conda recipe (recipe/meta.yaml + recipe/conda_build_config.yaml).

conda-build needs a reachable channel even to render a recipe (it solves to apply run_exports), so
this script renders meta.yaml itself (ci/conda_render.py), the way conda-build does, for every variant:

* the variants are the combinations of conda_build_config.yaml's keys (keys grouped under zip_keys
  advance together), for each platform in PLATFORMS (linux-64, linux-aarch64);
* meta.yaml is rendered with Jinja2 (StrictUndefined: an unknown name is an error) and the
  functions conda-build provides to recipes -- compiler(), stdlib(), load_file_regex(),
  load_file_data(), environ, pin_compatible()/pin_subpackage() (refused: their result depends on a
  solve) -- and the context names CONDA_PY, PY_VER, PYTHON, PKG_HASH, target_platform and the
  variant's keys;
* then line selectors (``# [expr]``) are evaluated per variant and platform, as conda-build does
  after Jinja (linux, linux64, aarch64, x86_64, py, target_platform, variant keys, ...);
* the result is parsed with PyYAML and checked: the required keys, the variant matrix the project
  promises (CUDA 12.9 with glibc 2.17 and 13.0 with glibc 2.28), and agreement with pyproject.toml
  (version via src/stridedfa/_version.py, requires-python and classifiers, runtime dependencies per
  CUDA major, the header packages' pins in build-system.requires).

Usage: python ci/check_recipe.py [--recipe recipe] [--pyproject pyproject.toml]
Prints one line per variant (``ok`` or ``FAIL``) and the reasons for every failure; exits 1 when
anything fails. Needs jinja2 and pyyaml (the project's ``test`` extra).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, when loaded by path (tests)
from conda_render import (  # noqa: E402
    PKG_HASH,
    YAML_LOADER,
    CheckError,
    apply_selectors,
    expand_variants,
    render,
    selector_namespace,
)

REPO = Path(__file__).resolve().parent.parent

# What the recipe must cover (issue 4, item 3).
PLATFORMS = ("linux-64", "linux-aarch64")
CUDA_STDLIB = {"12.9": "2.17", "13.0": "2.28"}  # cuda_compiler_version -> c_stdlib_version
PACKAGE_NAME = "stridedfa"
# Header packages whose run_exports must be ignored (the package dlopens, never links). A name
# ending in "_" is a prefix for the per-platform packages (cuda-crt-dev_linux-64, ...).
HEADER_PACKAGES = ("libcudnn-dev", "cuda-cudart-dev", "cuda-crt-dev_", "cuda-cccl", "cuda-nvrtc-dev")
BUILD_TOOLS = ("cmake", "ninja")
HOST_TOOLS = ("python", "pip", "scikit-build-core", "cython", "cython-cmake")
TEST_COMMANDS = ('python -c "import stridedfa; print(stridedfa.info())"', "python -m stridedfa")
# pyproject build-system.requires -> the conda host package holding the same thing.
BUILD_REQUIRES_TO_HOST = {
    "scikit-build-core": "scikit-build-core",
    "cython": "cython",
    "cython-cmake": "cython-cmake",
    "nvidia-cudnn-frontend": "python-cudnn-frontend",
    "jaxlib": "jaxlib",
}
SPEC_OPS = ("==", ">=", "<=", "!=", "~=", ">", "<", "=")


# ----------------------------------------------------------------------------------------------
# Version specifiers (pip's and conda's), just what the recipe and pyproject.toml use.


def version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.strip().rstrip("*").rstrip(".").split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse_constraints(text: str) -> list[tuple[str, str]]:
    """'>=9.13,<10' -> [('>=', '9.13'), ('<', '10')]; a bare conda version '1.2' -> [('==', '1.2')]."""
    constraints = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        for op in SPEC_OPS:
            if piece.startswith(op):
                constraints.append(("==" if op == "=" else op, piece[len(op):].strip()))
                break
        else:
            constraints.append(("==", piece))
    return constraints


def bound(constraints: list[tuple[str, str]], op: str) -> str | None:
    values = [value for o, value in constraints if o == op]
    return values[0] if values else None


@dataclass
class CondaSpec:
    name: str
    constraints: list[tuple[str, str]]
    build: str | None
    text: str


def parse_conda_spec(text: str) -> CondaSpec:
    parts = str(text).split()
    if not parts:
        raise CheckError(f"empty requirement {text!r}")
    name = parts[0]
    version = "".join(parts[1:2])
    if len(parts) > 2 and parts[1] in SPEC_OPS:  # 'name >= 1.2' style
        version, parts = parts[1] + parts[2], [name, parts[1] + parts[2], *parts[3:]]
    build = parts[2] if len(parts) > 2 else None
    return CondaSpec(name, parse_constraints(version), build, str(text))


@dataclass
class PipRequirement:
    name: str
    constraints: list[tuple[str, str]]
    marker: str | None


def parse_pip_requirement(text: str) -> PipRequirement:
    requirement, _, marker = text.partition(";")
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", requirement)
    if not match:
        raise CheckError(f"cannot parse the requirement {text!r} in pyproject.toml")
    name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    return PipRequirement(name, parse_constraints(match.group(3)), marker.strip() or None)


def marker_holds(marker: str | None, python: str) -> bool:
    """Evaluates the markers pyproject.toml uses: python_version comparisons joined by 'and'."""
    if not marker:
        return True
    for clause in re.split(r"\s+and\s+", marker.strip()):
        match = re.fullmatch(r"python_version\s*(==|!=|>=|<=|<|>)\s*['\"]([0-9.]+)['\"]", clause.strip())
        if not match:
            raise CheckError(f"unsupported environment marker {marker!r} in pyproject.toml")
        op, value = match.groups()
        left, right = version_tuple(python), version_tuple(value)
        if not {"==": left == right, "!=": left != right, ">=": left >= right, "<=": left <= right,
                "<": left < right, ">": left > right}[op]:
            return False
    return True


# ----------------------------------------------------------------------------------------------
# The project's side: pyproject.toml and _version.py.


@dataclass
class Project:
    version: str
    requires_python: list[tuple[str, str]]
    classifier_pythons: list[str]
    license: str | None
    dependencies: list[PipRequirement]
    build_requires: list[PipRequirement]


def read_project(pyproject: Path) -> Project:
    data = tomllib.loads(pyproject.read_text())
    project = data.get("project", {})
    version_file = pyproject.parent / "src" / "stridedfa" / "_version.py"
    version = None
    for node in ast.parse(version_file.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            version = ast.literal_eval(node.value)
    if not isinstance(version, str):
        raise CheckError(f"{version_file}: no __version__ string")
    if "dependencies" not in project:
        raise CheckError("pyproject.toml: project.dependencies is missing (dynamic?); the check compares "
                         "the recipe's run requirements with it")
    classifiers = project.get("classifiers", [])
    pythons = [m.group(1) for c in classifiers
               if (m := re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c))]
    license_ = project.get("license")
    if isinstance(license_, dict):
        license_ = license_.get("text")
    return Project(
        version=version,
        requires_python=parse_constraints(project.get("requires-python", "")),
        classifier_pythons=sorted(pythons, key=version_tuple),
        license=license_,
        dependencies=[parse_pip_requirement(d) for d in project["dependencies"]],
        build_requires=[parse_pip_requirement(r) for r in data.get("build-system", {}).get("requires", [])],
    )


# ----------------------------------------------------------------------------------------------
# Checks.


def names(section: list | None) -> dict[str, CondaSpec]:
    specs: dict[str, CondaSpec] = {}
    for entry in section or []:
        spec = parse_conda_spec(entry)
        specs[spec.name] = spec
    return specs


def cuda_major_of(requirement: PipRequirement) -> str | None:
    """nvidia-cudnn-cu13 -> '13'; nvidia-cuda-runtime(-cu12) -> the major of its bounds."""
    match = re.fullmatch(r"nvidia-(?:cudnn|cuda-runtime)-cu(\d+)", requirement.name)
    if match:
        return match.group(1)
    if requirement.name == "nvidia-cuda-runtime":
        low = bound(requirement.constraints, ">=") or bound(requirement.constraints, "==")
        return str(version_tuple(low)[0]) if low else None
    return None


def check_run(run: dict[str, CondaSpec], major: str, project: Project, python: str) -> list[str]:
    problems = []
    next_major = str(int(major) + 1)
    accounted = {"python"}

    def lower_equal(name: str, wanted: str | None) -> None:
        spec = run.get(name)
        if spec is None:
            problems.append(f"run: {name} is missing (pyproject.toml depends on it)")
            return
        if wanted is None:
            return
        low = bound(spec.constraints, ">=")
        if low is None or version_tuple(low) != version_tuple(wanted):
            problems.append(f"run: {spec.text!r} should have the lower bound >={wanted} of pyproject.toml")

    def major_range(name: str) -> None:
        spec = run.get(name)
        accounted.add(name)
        if spec is None:
            problems.append(f"run: {name} >={major},<{next_major} is missing")
            return
        low, high = bound(spec.constraints, ">="), bound(spec.constraints, "<")
        if low is None or version_tuple(low)[:1] != (int(major),) or high is None \
                or version_tuple(high) != (int(next_major),):
            problems.append(f"run: {spec.text!r} should be bounded at the CUDA major: >={major},<{next_major}")

    for requirement in project.dependencies:
        if not marker_holds(requirement.marker, python):
            continue
        if requirement.name.startswith("nvidia-cudnn-cu"):
            accounted.add("libcudnn")
            spec = run.get("libcudnn") or run.get("cudnn")
            if spec is None:
                problems.append("run: libcudnn (cuDNN 9, dlopen'ed) is missing")
                continue
            accounted.add(spec.name)
            want_low, want_high = bound(requirement.constraints, ">="), bound(requirement.constraints, "<")
            low, high = bound(spec.constraints, ">="), bound(spec.constraints, "<")
            if low is None or want_low is None or version_tuple(low)[:1] != version_tuple(want_low)[:1]:
                problems.append(f"run: {spec.text!r}: the cuDNN major of its lower bound differs from "
                                f"pyproject.toml's {requirement.name} >={want_low}")
            elif cuda_major_of(requirement) == major and version_tuple(low) != version_tuple(want_low):
                problems.append(f"run: {spec.text!r} should have the lower bound >={want_low} of "
                                f"pyproject.toml's {requirement.name} (same CUDA major)")
            if high is None or want_high is None or version_tuple(high) != version_tuple(want_high):
                problems.append(f"run: {spec.text!r} should have pyproject.toml's upper bound <{want_high}")
        elif requirement.name.startswith("nvidia-cuda-runtime"):
            pip_major = cuda_major_of(requirement)
            if pip_major is None:
                problems.append(f"pyproject.toml: cannot tell the CUDA major of {requirement.name}")
            major_range("cuda-cudart")
            major_range("cuda-version")
        elif requirement.name.startswith("nvidia-"):
            problems.append(f"pyproject.toml's dependency {requirement.name} has no counterpart the "
                            "check knows (extend ci/check_recipe.py and the recipe)")
        else:
            accounted.add(requirement.name)
            lower_equal(requirement.name, bound(requirement.constraints, ">="))
    if not any(r.name.startswith("nvidia-cuda-runtime") for r in project.dependencies):
        major_range("cuda-cudart")
        major_range("cuda-version")
    if "python" not in run:
        problems.append("run: python is missing")
    for extra in sorted(set(run) - accounted):
        problems.append(f"run: {run[extra].text!r} has no counterpart in pyproject.toml's dependencies")
    return problems


def check_variant(data: dict, platform: str, variant: dict[str, str], project: Project) -> tuple[list[str], str]:
    problems: list[str] = []
    cuda = variant.get("cuda_compiler_version", "")
    major = cuda.split(".")[0]
    python = variant.get("python", "")

    package = data.get("package") or {}
    if package.get("name") != PACKAGE_NAME:
        problems.append(f"package.name is {package.get('name')!r}, not {PACKAGE_NAME!r}")
    if str(package.get("version")) != project.version:
        problems.append(f"package.version {package.get('version')!r} differs from _version.py's {project.version!r}")
    source = data.get("source") or {}
    if not (source.get("path") or source.get("url") or source.get("git_url")):
        problems.append("source: needs path, url or git_url")

    build = data.get("build") or {}
    if build.get("skip") in (True, "true", "True"):
        problems.append("build.skip is true for a variant the matrix promises")
    number = build.get("number")
    if not isinstance(number, int):
        problems.append(f"build.number should be an integer, is {number!r}")
    string = str(build.get("string") or "")
    if not re.search(rf"(?<![0-9a-z])cuda{major}(?![0-9])", string):
        problems.append(f"build.string {string!r} does not name the CUDA major as cuda{major}")
    conda_py = "".join(python.split(".")[:2])
    if f"py{conda_py}" not in string or PKG_HASH not in string or f"h{PKG_HASH}" in string \
            or not string.endswith(f"_{number}"):
        problems.append(f"build.string {string!r} should hold py{conda_py}, {{{{ PKG_HASH }}}} (it starts "
                        f"with h already) and end with _<build number> (variants must not collide)")

    requirements = data.get("requirements") or {}
    build_reqs, host, run = (names(requirements.get(k)) for k in ("build", "host", "run"))
    if not any(n.startswith("gxx_") or n.startswith("clangxx_") for n in build_reqs):
        problems.append("requirements.build: {{ compiler('cxx') }} is missing")
    stdlib = variant.get("c_stdlib", "sysroot")
    stdlib_spec = build_reqs.get(f"{stdlib}_{platform}")
    if stdlib_spec is None:
        problems.append("requirements.build: {{ stdlib('c') }} is missing")
    elif bound(stdlib_spec.constraints, "==") != variant.get("c_stdlib_version"):
        problems.append(f"requirements.build: {stdlib_spec.text!r} does not follow c_stdlib_version")
    for tool in BUILD_TOOLS:
        if tool not in build_reqs and tool not in host:
            problems.append(f"requirements: {tool} is missing from build (or host)")
    for tool in HOST_TOOLS:
        if tool not in host:
            problems.append(f"requirements.host: {tool} is missing")
    cuda_version = host.get("cuda-version")
    if cuda_version is None or bound(cuda_version.constraints, "==") != cuda:
        problems.append(f"requirements.host: cuda-version {cuda} (the variant's cuda_compiler_version) is missing")
    ignored_from = set(build.get("ignore_run_exports_from") or [])
    ignored = ignored_from | set(build.get("ignore_run_exports") or [])
    for header in HEADER_PACKAGES:
        found = [n for n in host if (n.startswith(header) if header.endswith("_") else n == header)]
        if not found:
            problems.append(f"requirements.host: header package {header}* is missing")
        for name in found:
            if name not in ignored_from:
                problems.append(f"build.ignore_run_exports_from: {name} is missing (the package only dlopens)")
    if "cuda-version" not in ignored:
        problems.append("build.ignore_run_exports: cuda-version is missing")

    # Build-time pins shared with pyproject.toml's build-system.requires.
    for requirement in project.build_requires:
        conda_name = BUILD_REQUIRES_TO_HOST.get(requirement.name)
        if conda_name is None or not marker_holds(requirement.marker, python):
            continue
        spec = host.get(conda_name)
        if spec is None:
            problems.append(f"requirements.host: {conda_name} is missing "
                            f"(build-system.requires has {requirement.name})")
            continue
        for op in ("==", ">="):
            wanted = bound(requirement.constraints, op)
            if wanted is not None and (bound(spec.constraints, op) is None
                                       or version_tuple(bound(spec.constraints, op)) != version_tuple(wanted)):
                problems.append(f"requirements.host: {spec.text!r} should match build-system.requires "
                                f"{requirement.name}{op}{wanted}")
    for requirement in project.build_requires:
        if requirement.name.startswith("nvidia-cuda-") and cuda_major_of(
                PipRequirement("nvidia-cuda-runtime", requirement.constraints, None)) == major:
            wanted = bound(requirement.constraints, "==")
            if wanted and version_tuple(wanted) != version_tuple(cuda):
                problems.append(f"cuda_compiler_version {cuda} differs from build-system.requires "
                                f"{requirement.name}=={wanted} (the CUDA headers of the pip build)")
        if requirement.name.startswith("nvidia-cudnn-cu") and "libcudnn-dev" in host:
            spec = host["libcudnn-dev"]
            want = bound(requirement.constraints, "==")
            high = bound(spec.constraints, "<")
            if want and high and version_tuple(high)[:1] != (version_tuple(want)[0] + 1,):
                problems.append(f"requirements.host: {spec.text!r} is not cuDNN {version_tuple(want)[0]}")

    problems += check_run(run, major, project, python)

    test = data.get("test") or {}
    if PACKAGE_NAME not in (test.get("imports") or []):
        problems.append("test.imports: stridedfa is missing")
    commands = [str(c).strip() for c in test.get("commands") or []]
    for command in TEST_COMMANDS:
        if command not in commands:
            problems.append(f"test.commands: {command!r} is missing")

    about = data.get("about") or {}
    if not about.get("license"):
        problems.append("about.license is missing")
    elif project.license and about["license"] != project.license:
        problems.append(f"about.license {about['license']!r} differs from pyproject.toml's {project.license!r}")
    if not about.get("summary"):
        problems.append("about.summary is missing")
    return problems, f"{package.get('name')} {package.get('version')} {string}"


def check_matrix(variants: list[dict[str, str]], project: Project) -> list[str]:
    problems = []
    pairs = {(v.get("cuda_compiler_version"), v.get("c_stdlib_version")) for v in variants}
    if pairs != set(CUDA_STDLIB.items()):
        problems.append(f"conda_build_config.yaml: (cuda_compiler_version, c_stdlib_version) pairs are "
                        f"{sorted(pairs, key=str)}, should be {sorted(CUDA_STDLIB.items())} (zip them)")
    pythons = sorted({v.get("python", "") for v in variants}, key=version_tuple)
    if not pythons or not all(re.fullmatch(r"3\.\d+", p) for p in pythons):
        problems.append(f"conda_build_config.yaml: python should list versions like \"3.12\" (quoted), has {pythons}")
        return problems
    minors = [version_tuple(p)[1] for p in pythons]
    if minors != list(range(minors[0], minors[-1] + 1)):
        problems.append(f"conda_build_config.yaml: python versions {pythons} leave a gap")
    low = bound(project.requires_python, ">=")
    if low is None:
        problems.append("pyproject.toml: requires-python has no lower bound")
    elif version_tuple(pythons[0]) != version_tuple(low):
        problems.append(f"conda_build_config.yaml: the oldest python {pythons[0]} is not requires-python's >={low}")
    for op, value in project.requires_python:
        for python in pythons:
            if not marker_holds(f"python_version {op} '{value}'", python):
                problems.append(f"conda_build_config.yaml: python {python} is outside requires-python {op}{value}")
    if project.classifier_pythons and project.classifier_pythons != pythons:
        problems.append(f"conda_build_config.yaml: python {pythons} differs from pyproject.toml's classifiers "
                        f"{project.classifier_pythons}")
    return problems


def check_build_script(recipe: Path, data: dict) -> list[str]:
    script = (data.get("build") or {}).get("script")
    text = "\n".join(script) if isinstance(script, list) else str(script or "")
    if not text and (recipe / "build.sh").is_file():
        text = (recipe / "build.sh").read_text()
    problems = []
    for needed in ("STRIDEDFA_CUDA_MAJOR", "pip install", "--no-build-isolation", "--no-deps"):
        if needed not in text:
            problems.append(f"build script (build.script or build.sh): {needed!r} is missing")
    return problems


@dataclass
class Result:
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check(recipe: Path, pyproject: Path) -> Result:
    result = Result()
    try:
        project = read_project(pyproject)
        config_text = (recipe / "conda_build_config.yaml").read_text()
        source = (recipe / "..").resolve()
        variants_by_platform = {}
        for platform in PLATFORMS:
            text = apply_selectors(config_text, selector_namespace(platform, {}), "conda_build_config.yaml")
            variants_by_platform[platform] = expand_variants(yaml.load(text, Loader=YAML_LOADER) or {})
            for problem in check_matrix(variants_by_platform[platform], project):
                result.problems.append(f"{platform}: {problem}")
                result.lines.append(f"FAIL {platform}: {problem}")
    except CheckError as error:
        result.problems.append(str(error))
        result.lines.append(f"FAIL {error}")
        return result
    script_checked = False
    for platform, variants in variants_by_platform.items():
        strings: dict[str, str] = {}
        for variant in variants:
            label = (f"{platform} cuda {variant.get('cuda_compiler_version')} "
                     f"(glibc {variant.get('c_stdlib_version')}) python {variant.get('python')}")
            try:
                data = render(recipe, source, platform, variant)
                problems, summary = check_variant(data, platform, variant, project)
                source_path = (data.get("source") or {}).get("path")
                if source_path is not None and (recipe / str(source_path)).resolve() != pyproject.parent.resolve():
                    problems.append(f"source.path {source_path!r} is not the project root (where pyproject.toml is)")
                if not script_checked:
                    problems += check_build_script(recipe, data)
                    script_checked = True
                string = str((data.get("build") or {}).get("string"))
                if string in strings:
                    problems.append(f"build.string {string!r} is the same as for {strings[string]}")
                strings[string] = label
            except CheckError as error:
                problems, summary = [str(error)], ""
            if problems:
                result.lines.append(f"FAIL {label}")
                result.lines += [f"    {p}" for p in problems]
                result.problems += [f"{label}: {p}" for p in problems]
            else:
                result.lines.append(f"ok   {label}: {summary}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", type=Path, default=REPO / "recipe", help="recipe folder (default: recipe/)")
    parser.add_argument("--pyproject", type=Path, default=None,
                        help="pyproject.toml to compare with (default: the one above the recipe folder)")
    args = parser.parse_args(argv)
    recipe = args.recipe.resolve()
    pyproject = (args.pyproject or recipe.parent / "pyproject.toml").resolve()
    result = check(recipe, pyproject)
    for line in result.lines:
        print(line)
    if result.ok:
        print(f"recipe check passed: {len(result.lines)} variants")
        return 0
    print(f"recipe check FAILED: {len(result.problems)} problem(s)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
