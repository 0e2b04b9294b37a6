"""The CI matrix and the ci/ scripts (CPU, no build): ci/matrix.py expands each job kind to the
expected cells and rejects bad files; every ci/ script the workflow calls exists and answers --help;
the packaging metadata checks pass on a consistent copy of the repository and fail on broken ones."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
CI = REPO / "ci"
WORKFLOW = REPO / ".github/workflows/ci.yml"
sys.path.insert(0, str(CI))
import matrix  # noqa: E402  (ci/matrix.py)

CONDA_SCRIPTS = {"ci/build_conda.sh", "ci/check_recipe.py"}  # come with recipe/ (branch conda)


def expand(kind: str) -> list[dict]:
    return matrix.expand(matrix.load(), kind)["include"]


def cells(kind: str) -> set[tuple]:
    return {(c["cuda_major"], c["arch"], c["python"]) for c in expand(kind)}


# --- ci/matrix.py expansion -------------------------------------------------------------------

def test_wheels_are_every_cuda_major_arch_and_python():
    expected = set(itertools.product([12, 13], ["x86_64", "aarch64"], ["3.10", "3.11", "3.12", "3.13"]))
    assert cells("wheels") == expected
    runs = expand("wheels")
    assert len(runs) == 16
    assert {c["runner"] for c in runs if c["arch"] == "x86_64"} == {"ubuntu-24.04"}
    assert {c["runner"] for c in runs if c["arch"] == "aarch64"} == {"ubuntu-24.04-arm"}
    assert len({c["artifact"] for c in runs}) == 16


def test_conda_variants():
    got = {(c["cuda"], c["subdir"], c["runner"]) for c in expand("conda")}
    assert got == {("12.9", "linux-64", "ubuntu-24.04"), ("12.9", "linux-aarch64", "ubuntu-24.04-arm"),
                   ("13.0", "linux-64", "ubuntu-24.04"), ("13.0", "linux-aarch64", "ubuntu-24.04-arm")}


def test_cpu_tests_are_a_subset_of_the_wheels_with_each_major_and_both_python_ends():
    got = cells("cpu-tests")
    assert got == {(12, "x86_64", "3.10"), (12, "x86_64", "3.13"), (13, "x86_64", "3.10"),
                   (13, "x86_64", "3.13"), (12, "aarch64", "3.13"), (13, "aarch64", "3.13")}
    wheel_artifacts = {c["artifact"] for c in expand("wheels")}
    assert {c["artifact"] for c in expand("cpu-tests")} <= wheel_artifacts


def test_gpu_tests_run_on_self_hosted_gpu_runners():
    (cell,) = expand("gpu-tests")
    assert (cell["cuda_major"], cell["arch"], cell["python"]) == (13, "x86_64", "3.12")
    assert cell["runner"] == ["self-hosted", "linux", "x64", "gpu", "h200"]
    assert cell["artifact"] in {c["artifact"] for c in expand("wheels")}
    assert cell["with_args"] == "--with torch"
    assert cell["pip_extra_index_url"].endswith("/cu130")


@pytest.mark.parametrize("kind", matrix.KINDS)
def test_cli_prints_the_strategy_matrix_json(kind):
    result = subprocess.run([sys.executable, str(CI / "matrix.py"), kind],
                            capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == matrix.expand(matrix.load(), kind)


BROKEN = [
    ("unknown top-level key", lambda d: d.update(extra=1), "unknown key(s) ['extra']"),
    ("unknown wheel key", lambda d: d["wheels"].update(os=["linux"]), "unknown key(s) ['os']"),
    ("python as a float", lambda d: d["wheels"]["python"].append(3.1), "must be a quoted"),
    ("unsupported CUDA major", lambda d: d["wheels"]["cuda_major"].append(11), "cuda_major 11"),
    ("unknown arch", lambda d: d["wheels"]["arch"].append("arm64"), "arch 'arm64'"),
    ("conda cuda unquoted", lambda d: d["conda"]["cuda"].__setitem__(0, 12.9), "cuda 12.9 is not"),
    ("test of an unbuilt wheel", lambda d: d["cpu_tests"][0].update(python="3.9"), "does not build"),
    ("duplicate python", lambda d: d["wheels"]["python"].append("3.12"), "duplicate"),
    ("GPU runner not self-hosted", lambda d: d["gpu_tests"][0].update(runner=["ubuntu-24.04"]), "self-hosted"),
    ("missing runner for an arch", lambda d: d["runners"].pop("aarch64"), "missing key(s) ['aarch64']"),
]


@pytest.mark.parametrize("name, edit, message", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_bad_matrix_file_is_rejected_with_its_reason(tmp_path, name, edit, message):
    data = yaml.safe_load((CI / "matrix.yml").read_text())
    edit(data)
    path = tmp_path / "matrix.yml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(matrix.MatrixError) as error:
        matrix.load(path)
    assert message in str(error.value)
    result = subprocess.run([sys.executable, str(CI / "matrix.py"), "wheels", "--file", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 1 and message in result.stderr and not result.stdout


# --- the workflow and its scripts -------------------------------------------------------------

def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def referenced_scripts() -> list[str]:
    return sorted(set(re.findall(r"(?<![\w./-])(ci/[\w./-]+\.(?:sh|py))", WORKFLOW.read_text())))


def test_workflow_jobs_expand_the_matrix():
    jobs = workflow()["jobs"]
    assert set(jobs) == {"matrix", "build-wheel", "build-conda", "cpu-tests", "gpu-tests", "publish"}
    for job, kind in [("build-wheel", "wheels"), ("build-conda", "conda"),
                      ("cpu-tests", "cpu-tests"), ("gpu-tests", "gpu-tests")]:
        assert jobs[job]["strategy"]["matrix"] == f"${{{{ fromJSON(needs.matrix.outputs.{kind}) }}}}"
        assert kind in jobs["matrix"]["outputs"]
    assert jobs["publish"]["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert "concurrency" in workflow()
    on = workflow()[True]  # YAML 1.1 reads the key `on` as True
    assert on["push"]["tags"] == ["v*"]


def test_workflow_calls_the_job_scripts():
    assert set(referenced_scripts()) >= {
        "ci/check_packaging.sh", "ci/matrix.py", "ci/build_wheel.sh", "ci/build_conda.sh",
        "ci/test_cpu.sh", "ci/test_gpu.sh", "ci/publish.sh"}


@pytest.mark.parametrize("script", referenced_scripts())
def test_every_script_the_workflow_calls_exists_and_answers_help(script):
    path = REPO / script
    if script in CONDA_SCRIPTS and not (REPO / "recipe").is_dir():
        pytest.skip(f"{script} comes with recipe/ (not in this checkout)")
    assert path.is_file(), f"{script} is referenced by the workflow but missing"
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    command = [sys.executable, str(path)] if path.suffix == ".py" else [str(path)]
    result = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def run(*command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=120, **kwargs)


def test_scripts_reject_bad_arguments(tmp_path):
    assert run(CI / "build_wheel.sh", "--cuda-major", "11").returncode == 2
    assert run(CI / "build_wheel.sh", "--cuda-major", "13", "--bogus").returncode == 2
    for name in ("a", "b"):
        (tmp_path / f"stridedfa_cu13-0.1.0-{name}-none-any.whl").touch()
    result = run(CI / "test_cpu.sh", "--wheel", tmp_path)
    assert result.returncode == 2 and "holds 2 wheels" in result.stderr
    assert run(CI / "test_gpu.sh", "--wheel", tmp_path, "--tests", "some").returncode == 2


def test_publish_refuses_files_that_are_not_stridedfa_wheels(tmp_path):
    (tmp_path / "stridedfa_cu13-0.1.0-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
    (tmp_path / "stridedfa-0.1.0.tar.gz").touch()
    result = run(CI / "publish.sh", "--dist", tmp_path, "--dry-run")
    assert result.returncode == 1 and "not a stridedfa-cu12/cu13 wheel" in result.stderr
    (tmp_path / "stridedfa-0.1.0.tar.gz").unlink()
    (tmp_path / "stridedfa_cu12-0.2.0-cp312-cp312-manylinux_2_28_x86_64.whl").touch()
    result = run(CI / "publish.sh", "--dist", tmp_path, "--dry-run")
    assert result.returncode == 1 and "more than one version" in result.stderr


# --- packaging metadata checks ----------------------------------------------------------------

BACKEND = '''"""Stand-in for the in-tree build backend that reads STRIDEDFA_CUDA_MAJOR."""
import os
REQUIRES = {12: ["nvidia-cudnn-cu12"], 13: ["nvidia-cudnn-cu13"]}
MAJOR = int(os.environ.get("STRIDEDFA_CUDA_MAJOR", "13"))
'''


@pytest.fixture
def repo_copy(tmp_path) -> Path:
    """The files the packaging checks read, copied; where this checkout's build does not yet take
    STRIDEDFA_CUDA_MAJOR, a stand-in in-tree backend that does (the copy must be consistent)."""
    root = tmp_path / "repo"
    for name in ("pyproject.toml", "src/stridedfa/_version.py", "src/stridedfa/__init__.py",
                 ".github/workflows/ci.yml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(CI, root / "ci", ignore=shutil.ignore_patterns("results", "__pycache__"))
    import check_metadata  # ci/check_metadata.py

    pyproject = check_metadata.tomllib.loads((root / "pyproject.toml").read_text())
    if check_metadata.check_cuda_majors(root, pyproject, [12, 13]):
        (root / "backend").mkdir()
        (root / "backend/stridedfa_backend.py").write_text(BACKEND)
        text = (root / "pyproject.toml").read_text()
        (root / "pyproject.toml").write_text(
            text.replace("[build-system]\n", '[build-system]\nbackend-path = ["backend"]\n', 1))
    return root  # no recipe/: the conda scripts and the recipe check are not part of the copy


def check(root: Path) -> subprocess.CompletedProcess:
    return run(sys.executable, root / "ci/check_metadata.py", "--root", root)


def test_metadata_checks_pass_on_a_consistent_copy(repo_copy):
    result = check(repo_copy)
    assert result.returncode == 0, result.stderr
    result = run(repo_copy / "ci/check_packaging.sh", "--python", sys.executable)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "packaging checks: passed" in result.stdout
    assert "matrix wheels: 16 cells" in result.stdout


def edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


BREAKS = [
    ("version set twice", "pyproject.toml", 'dynamic = ["version"]', 'version = "0.2.0"\ndynamic = []',
     "must be dynamic"),
    ("version file unreadable", "src/stridedfa/_version.py", "__version__ = ", "version = ",
     "expected one `__version__"),
    ("oldest python not built", "pyproject.toml", 'requires-python = ">=3.10"',
     'requires-python = ">=3.9"', "lowest python 3.10 is not requires-python's lower bound"),
    ("matrix python outside requires-python", "pyproject.toml", 'requires-python = ">=3.10"',
     'requires-python = ">=3.10,<3.13"', "python 3.13 does not satisfy"),
    ("matrix python classifiers disagree", "pyproject.toml", '"Programming Language :: Python :: 3",',
     '"Programming Language :: Python :: 3",\n  "Programming Language :: Python :: 3.10",',
     "Python classifiers"),
    ("CUDA major the build lacks", "ci/matrix.py", "CUDA_MAJORS = (12, 13)", "CUDA_MAJORS = (11, 12, 13)",
     "builds CUDA 11"),
]


@pytest.mark.parametrize("name, file, old, new, message", BREAKS, ids=[b[0] for b in BREAKS])
def test_metadata_checks_fail_on_a_broken_copy(repo_copy, name, file, old, new, message):
    edit(repo_copy / file, old, new)
    if name == "CUDA major the build lacks":
        edit(repo_copy / "ci/matrix.yml", "cuda_major: [12, 13]", "cuda_major: [11, 12, 13]")
    result = check(repo_copy)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    if name == "version set twice":  # the gate's script fails with it (one case is enough)
        result = run(repo_copy / "ci/check_packaging.sh", "--python", sys.executable)
        assert result.returncode == 1 and "packaging checks: FAILED" in result.stderr


def test_packaging_check_fails_when_a_workflow_script_is_missing(repo_copy):
    (repo_copy / "ci/test_cpu.sh").unlink()
    result = run(repo_copy / "ci/check_packaging.sh", "--python", sys.executable)
    assert result.returncode == 1 and "calls ci/test_cpu.sh, which is missing" in result.stderr
