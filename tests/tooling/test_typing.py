"""Type stubs ship with the package and say what the compiled module holds; mypy checks the
package's typed API (run by `.ci/run`, which installs the pinned mypy; skipped where it is absent)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stridedfa
from stridedfa import _core

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(stridedfa.__file__).parent


def stub_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def test_the_installed_package_ships_its_stubs_and_py_typed():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_core.pyi").is_file()


def test_core_stub_lists_exactly_the_compiled_modules_functions_and_classes():
    compiled = {name for name in dir(_core) if callable(getattr(_core, name)) and not name.startswith("__")
                and getattr(getattr(_core, name), "__module__", "stridedfa._core") == "stridedfa._core"}
    compiled -= {"LayoutError", "UnsupportedError", "BackendError", "StridedFAError"}  # re-exported errors
    stubbed = stub_names(ROOT / "src" / "stridedfa" / "_core.pyi") - {"_CudaStream"}
    assert compiled == stubbed, {"not stubbed": compiled - stubbed, "stubbed, not compiled": stubbed - compiled}


@pytest.mark.skipif(shutil.which("mypy") is None and not any(
    (Path(p) / "mypy").is_dir() for p in sys.path), reason="mypy is not installed (.ci/run installs it)")
def test_mypy_passes_on_the_package():
    result = subprocess.run([sys.executable, "-m", "mypy", "-p", "stridedfa"], cwd=ROOT / "src",
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def stub_parameters(path: Path) -> dict[str, list[str]]:
    tree = ast.parse(path.read_text())
    def names(args: ast.arguments) -> list[str]:
        starred = [a for a in (args.vararg, args.kwarg) if a is not None]
        return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs + starred]
    return {node.name: names(node.args) for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_core_stub_names_each_functions_parameters_as_compiled():
    # mypy trusts the stub, so a parameter added to a Cython function but not to its stub makes
    # every keyword caller a type error (CI failed on exactly that once)
    import inspect
    differ = {}
    for name, stubbed in stub_parameters(ROOT / "src" / "stridedfa" / "_core.pyi").items():
        try:
            compiled = list(inspect.signature(getattr(_core, name)).parameters)
        except (AttributeError, ValueError, TypeError):
            continue  # not introspectable (a cdef class member or builtin): the name test covers it
        if compiled != stubbed:
            differ[name] = {"compiled": compiled, "stub": stubbed}
    assert not differ, differ
