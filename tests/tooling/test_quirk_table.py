"""Every row of the cuDNN quirk table (cpp/include/stridedfa/cudnn_quirks.hpp) names its GPU
reproduction, and that test exists; a row without one says why ("none: ...")."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_quirk_names_a_reproduction_that_exists():
    table = (ROOT / "cpp" / "include" / "stridedfa" / "cudnn_quirks.hpp").read_text()
    rows = re.findall(r'\{Quirk::(\w+), "(\w+)",.*?"([^"]*)"\},', table, re.S)
    assert len(rows) >= 10, rows
    tests = {node.name for node in ast.parse((ROOT / "tests" / "gpu" / "test_cudnn_quirks.py").read_text()).body
             if isinstance(node, ast.FunctionDef)}
    for quirk, name, reproduction in rows:
        assert quirk == name, (quirk, name)
        if reproduction.startswith("none: "):
            continue
        assert reproduction == f"test_cudnn_quirks.py::test_{name}", (name, reproduction)
        assert f"test_{name}" in tests, f"{name}: its reproduction test_{name} is not in tests/gpu/test_cudnn_quirks.py"
