"""The conda recipe (recipe/) renders for every variant and agrees with pyproject.toml
(ci/check_recipe.py), and the check fails, naming the problem, on recipes that are wrong.

Needs jinja2 and pyyaml (the ``test`` extra), not the built extension: nothing here imports
stridedfa."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jinja2", reason="the recipe check needs jinja2 (pip install -e .[test])")
pytest.importorskip("yaml", reason="the recipe check needs pyyaml (pip install -e .[test])")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "ci" / "check_recipe.py"


def load_check():
    spec = importlib.util.spec_from_file_location("check_recipe", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_recipe", module)
    spec.loader.exec_module(module)
    return module


check_recipe = load_check()


def test_every_variant_renders_and_agrees_with_pyproject():
    result = check_recipe.check(REPO / "recipe", REPO / "pyproject.toml")
    assert result.ok, "\n".join(result.lines)
    # 2 platforms x 2 CUDA versions (zipped with their glibc) x 4 Pythons.
    assert len(result.lines) == 16
    assert all(line.startswith("ok ") for line in result.lines)
    for major in ("12", "13"):
        assert sum(f"cuda{major}_py" in line for line in result.lines) == 8


def test_cli_prints_one_line_per_variant_and_exits_zero():
    run = subprocess.run([sys.executable, str(SCRIPT), "--recipe", str(REPO / "recipe")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len([line for line in lines if line.startswith("ok ")]) == 16
    assert lines[-1] == "recipe check passed: 16 variants"


@pytest.fixture
def copy(tmp_path):
    """A project root holding only what the check reads: recipe/, pyproject.toml, _version.py."""
    shutil.copytree(REPO / "recipe", tmp_path / "recipe")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "src" / "stridedfa").mkdir(parents=True)
    shutil.copy(REPO / "src" / "stridedfa" / "_version.py", tmp_path / "src" / "stridedfa" / "_version.py")
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_copy_passes(copy):
    assert check_recipe.check(copy / "recipe", copy / "pyproject.toml").ok


BROKEN = {
    "version not from _version.py": (
        "recipe/meta.yaml", "version: {{ version }}", "version: 0.0.9", "package.version '0.0.9' differs"),
    "numpy bound out of sync": (
        "pyproject.toml", '"numpy>=1.23"', '"numpy>=1.26"', "lower bound >=1.26 of pyproject.toml"),
    "cuDNN floor of the CUDA-13 build out of sync": (
        "pyproject.toml", '"nvidia-cudnn-cu13>=9.13,<10"', '"nvidia-cudnn-cu13>=9.14,<10"',
        "lower bound >=9.14 of pyproject.toml's nvidia-cudnn-cu13"),
    "cuDNN not bounded below 10": (
        "recipe/meta.yaml", "libcudnn >={{ cudnn_min }},<10", "libcudnn >={{ cudnn_min }}",
        "upper bound <10"),
    "CUDA runtime not bounded at the major": (
        "recipe/meta.yaml", "cuda-cudart >={{ cuda_major }},<{{ cuda_next }}", "cuda-cudart >={{ cuda_major }}",
        "bounded at the CUDA major"),
    "run dependency pyproject.toml lacks": (
        "recipe/meta.yaml", "    - numpy >=1.23\n", "    - numpy >=1.23\n    - scipy\n",
        "'scipy' has no counterpart in pyproject.toml"),
    "a -dev package's run_exports kept": (
        "recipe/meta.yaml", "    - libcudnn-dev\n    - cuda-cudart-dev\n", "    - cuda-cudart-dev\n",
        "ignore_run_exports_from: libcudnn-dev is missing"),
    "build string without the CUDA major": (
        "recipe/meta.yaml", "string: cuda{{ cuda_major }}_py", "string: py", "does not name the CUDA major"),
    "hash doubled h (PKG_HASH starts with h)": (
        "recipe/meta.yaml", "{{ CONDA_PY }}{{ PKG_HASH }}", "{{ CONDA_PY }}h{{ PKG_HASH }}",
        "it starts with h already"),
    "CUDA 13 with the glibc 2.17 sysroot": (
        "recipe/conda_build_config.yaml", '  - "2.28"', '  - "2.17"', "(cuda_compiler_version, c_stdlib_version)"),
    "Python below requires-python": (
        "recipe/conda_build_config.yaml", 'python:\n  - "3.10"', 'python:\n  - "3.9"\n  - "3.10"',
        "outside requires-python >=3.10"),
    "jaxlib headers differ from the pip build's": (
        "pyproject.toml", "\"jaxlib==0.6.2; python_version < '3.14'\"", "\"jaxlib==0.7.0; python_version < '3.14'\"",
        "should match build-system.requires jaxlib==0.7.0"),
    "a selector drops a header package on aarch64": (
        "recipe/meta.yaml", "    - libcudnn-dev >=9,<10\n", "    - libcudnn-dev >=9,<10  # [x86_64]\n",
        "header package libcudnn-dev* is missing"),
    "an undefined Jinja name": (
        "recipe/meta.yaml", "{{ build_number }}\n  skip", "{{ build_numbr }}\n  skip", "'build_numbr' is undefined"),
    "test section without the CPU demo": (
        "recipe/meta.yaml", "    - python -m stridedfa\n", "", "'python -m stridedfa' is missing"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_copy_fails_with_the_reason(copy, case):
    path, old, new, expected = BROKEN[case]
    edit(copy / path, old, new)
    result = check_recipe.check(copy / "recipe", copy / "pyproject.toml")
    assert not result.ok
    assert any(expected in problem for problem in result.problems), "\n".join(result.problems)
    run = subprocess.run([sys.executable, str(SCRIPT), "--recipe", str(copy / "recipe")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert expected in run.stdout
    assert "recipe check FAILED" in run.stderr


def test_selector_only_on_aarch64_fails_only_there(copy):
    edit(copy / "recipe" / "meta.yaml", "    - libcudnn-dev >=9,<10\n", "    - libcudnn-dev >=9,<10  # [x86_64]\n")
    result = check_recipe.check(copy / "recipe", copy / "pyproject.toml")
    failed = [line for line in result.lines if line.startswith("FAIL ")]
    assert len(failed) == 8 and all("linux-aarch64" in line for line in failed)


def test_build_script_dry_run_passes_the_variant(tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    run = subprocess.run([bash, str(REPO / "ci" / "build_conda.sh"), "--skip-check", "--dry-run",
                          "--cuda", "12.9", "--python", "3.11", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    command = run.stdout.replace("\\", "")
    assert command.startswith("conda-build ") and str(REPO / "recipe") in command
    assert "cuda_compiler_version: ['12.9']" in command and "c_stdlib_version: ['2.17']" in command
    assert "python: ['3.11']" in command and "-c conda-forge" in command
