"""The error catalogue of the documentation (docs/pages/errors.md) quotes real messages: each example of
docs/error_examples.py is provoked again here, on fake CUDA tensors without a GPU, and its message must
appear in errors.md word for word. When a message changes on purpose, run
``python docs/error_examples.py`` and paste the new text into errors.md."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "docs" / "error_examples.py"
PAGE = REPO / "docs" / "pages" / "errors.md"

pytestmark = pytest.mark.skipif(not SCRIPT.is_file() or not PAGE.is_file(), reason="no docs/ next to the tests")


def load_examples():
    spec = importlib.util.spec_from_file_location("docs_error_examples", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module.examples()


def normalise(text: str) -> str:
    # The cuDNN wheel a message recommends follows the build's CUDA major; the page shows a cu13 build.
    return re.sub(r"nvidia-cudnn-cu1\d", "nvidia-cudnn-cu13", text)


def test_every_documented_error_message_is_the_packages_own():
    page = PAGE.read_text(encoding="utf-8")
    examples = load_examples()
    assert len(examples) >= 10
    stale = [f"{e['title']}:\n  {e['exception']}: {e['message']}" for e in examples
             if normalise(f"{e['exception']}: {e['message']}") not in page]
    assert not stale, ("docs/pages/errors.md no longer shows what stridedfa says; update these examples "
                       "(python docs/error_examples.py prints them):\n" + "\n".join(stale))


def test_the_exception_classes_are_documented_with_their_bases():
    import stridedfa

    page = PAGE.read_text(encoding="utf-8")
    for cls in (stridedfa.StridedFAError, stridedfa.LayoutError, stridedfa.UnsupportedError, stridedfa.BackendError):
        bases = ", ".join(f"`{base.__name__}`" for base in cls.__bases__)
        assert f"| `{cls.__name__}` | {bases} |" in page, cls
