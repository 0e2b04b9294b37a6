"""The CuPy adapter without a GPU: import behaviour, argument checks, and the layouts it allocates
(with CuPy's allocator and the core replaced by recorders)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from helpers.fake_dlpack import FakeTensor
from stridedfa import _layouts


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True)


def test_import_stridedfa_imports_no_framework():
    result = _run("""
        import sys, stridedfa
        print(sorted(m for m in ("torch", "cupy", "jax", "jaxlib") if m in sys.modules))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_stridedfa_cupy_without_cupy_is_a_clear_import_error():
    result = _run("""
        import sys
        sys.modules["cupy"] = None  # as if CuPy were not installed
        import stridedfa
        try:
            stridedfa.cupy
        except ImportError as error:
            print("ImportError:", error)
        try:
            import stridedfa.cupy
        except ImportError as error:
            print("ImportError:", error)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert line.startswith("ImportError: stridedfa.cupy needs CuPy"), line
        assert "pip install cupy-cuda13x" in line


# --- The adapter's logic (CuPy arrays need a GPU, so fakes stand in for them) ----------------------

class FakeArray:
    """What the core's hooks build for an allocation: shape, strides in bytes, dtype, memptr."""

    def __init__(self, shape, strides_bytes, dtype, memptr=None):
        import numpy as np

        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.shape = tuple(shape)
        self.strides = tuple(strides_bytes)
        self.memptr = memptr


def _fake_cupy():
    """The little of CuPy that importing stridedfa.cupy touches, for machines without CuPy (CI).
    One instance per process: the core remembers the cupy.cuda module it has seen."""
    import numpy as np

    def unavailable(*args, **kwargs):
        raise RuntimeError("fake CuPy: no CUDA here")

    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    stream = types.ModuleType("cupy.cuda.stream")
    runtime = types.SimpleNamespace(getDevice=unavailable)
    stream._BaseStream = type("_BaseStream", (), {})
    cuda.stream, cuda.runtime, cuda.alloc, cuda.Device = stream, runtime, unavailable, unavailable
    cuda.get_current_stream = unavailable
    cupy.cuda, cupy.ndarray, cupy.dtype, cupy.float32 = cuda, type("ndarray", (), {}), np.dtype, np.float32
    cupy.ascontiguousarray = unavailable
    cupy.__fake__ = True
    return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.stream": stream}


_FAKE_CUPY = _fake_cupy()


@pytest.fixture
def cupy_module(monkeypatch):
    """CuPy if it is installed, else the fake one, installed in sys.modules for the test."""
    try:
        import cupy

        return cupy
    except ImportError:
        for name, module in _FAKE_CUPY.items():
            monkeypatch.setitem(sys.modules, name, module)
        import stridedfa

        monkeypatch.setattr(stridedfa, "cupy", None, raising=False)  # restored afterwards
        monkeypatch.delitem(sys.modules, "stridedfa.cupy", raising=False)
        return _FAKE_CUPY["cupy"]


@pytest.fixture
def adapter(monkeypatch, cupy_module):
    """stridedfa.cupy with the hooks the core allocates through replaced by recorders."""
    import numpy as np

    import stridedfa.cupy as adapter

    record = {"allocations": [], "arrays": []}

    class Memory:
        def __init__(self, nbytes):
            self.nbytes = nbytes
            self.ptr = 0x7E0000000000 + 0x10000000 * (len(record["allocations"]) + 1)

    def alloc(nbytes):
        record["allocations"].append(nbytes)
        return Memory(nbytes)

    def new_array(shape, dtype, memptr, strides):
        array = FakeArray(shape, strides, dtype, memptr)
        record["arrays"].append(array)
        return array

    hooks = types.SimpleNamespace(alloc=alloc, new_array=new_array, float32=np.dtype("float32"),
                                  contiguous=lambda x: x)
    monkeypatch.setattr(adapter, "_HOOKS", hooks)
    adapter.record = record
    return adapter


def _elements(array):
    return tuple(s // array.itemsize for s in array.strides)


PACKED_BSHD = ((2, 4, 128, 64), (128 * 3 * 4 * 64, 64, 3 * 4 * 64, 1))  # q of a (b, s, 3, h, d) qkv


@pytest.mark.parametrize("q_layout", [
    ((2, 4, 128, 64), (4 * 128 * 64, 128 * 64, 64, 1)),   # bhsd
    ((2, 4, 128, 64), (128 * 4 * 64, 64, 4 * 64, 1)),     # bshd (a transposed view)
    PACKED_BSHD,
])
def test_forward_allocates_out_in_q_axis_order_and_packed_lse(adapter, q_layout):
    from stridedfa import _core

    shape, strides = q_layout
    q = FakeTensor(shape, strides, "float16")
    v = FakeTensor((2, 4, 256, 32), dtype="float16")
    out, lse = _core._cupy_allocate_like_forward(q, v, True, adapter._HOOKS)

    assert out.shape == (2, 4, 128, 32) and out.dtype.name == "float16"
    assert _elements(out) == _layouts.output_strides((2, 4, 128, 32), strides)
    assert lse.shape == (2, 4, 128) and lse.dtype.name == "float32"
    assert _elements(lse) == (4 * 128, 128, 1)
    assert adapter.record["allocations"] == [2 * 4 * 128 * 32 * 2, 2 * 4 * 128 * 4]


def test_forward_without_lse_allocates_only_out(adapter):
    from stridedfa import _core

    q = FakeTensor(*PACKED_BSHD, "float16")
    out, lse = _core._cupy_allocate_like_forward(q, q, False, adapter._HOOKS)
    assert isinstance(out, FakeArray) and lse is None
    assert len(adapter.record["allocations"]) == 1


def test_backward_allocates_gradients_by_the_layout_rule(adapter):
    from stridedfa import _core

    dense_bshd = ((2, 8, 64, 128), (64 * 8 * 128, 128, 8 * 128, 1))
    q = FakeTensor(*dense_bshd, "float16")
    k = FakeTensor(*PACKED_BSHD, "float16")  # a packed view: compact gradient in its axis order
    v = FakeTensor((2, 4, 128, 64), (4 * 128 * 64, 128 * 64, 64, 1), "float16")
    grads = _core._cupy_allocate_gradients(q, k, v, adapter._HOOKS)
    for grad, x in zip(grads, (q, k, v)):
        assert grad.shape == x.shape
        assert _elements(grad) == _layouts.gradient_strides(x.shape, x.strides)
    assert _elements(grads[0]) == dense_bshd[1]  # dense input: the same strides


def test_backward_needs_cupy_arrays_for_the_gradients_it_allocates(adapter, cupy_module):
    q = object.__new__(cupy_module.ndarray) if getattr(cupy_module, "__fake__", False) else \
        cupy_module.zeros((1, 1, 8, 64), cupy_module.float16)
    with pytest.raises(TypeError, match=r"attention_backward takes k as a cupy.ndarray"):
        adapter.attention_backward(q, FakeArray(*PACKED_BSHD, "float16"), q, None, None, None)


def test_inputs_that_are_not_4d_are_layout_errors(adapter):
    import stridedfa
    from stridedfa import _core

    q = FakeTensor((4, 128, 64), dtype="float16")
    with pytest.raises(stridedfa.LayoutError, match=r"^q: expected 4 axes \(batch, heads, seq, head_dim\), got 3"):
        _core._cupy_allocate_like_forward(q, q, False, adapter._HOOKS)
    assert adapter.record["allocations"] == []


def test_q_must_be_a_cupy_array(adapter):
    with pytest.raises(TypeError, match=r"takes q as a cupy.ndarray.*FakeArray"):
        adapter.attention(FakeArray(*PACKED_BSHD, "float16"), None, None)
    with pytest.raises(TypeError, match=r"attention_backward takes q as a cupy.ndarray"):
        adapter.attention_backward(object(), None, None, None, None, None)


@pytest.mark.parametrize("stream,error", [("s", TypeError), (True, TypeError), (-3, ValueError)])
def test_bad_streams_are_refused_before_any_cuda_call(adapter, stream, error):
    with pytest.raises(error, match="stream"):
        adapter._call_stream(stream)


def test_cupy_is_a_lazy_attribute_of_stridedfa():
    pytest.importorskip("cupy")
    import stridedfa

    assert stridedfa.cupy.attention.__module__ == "stridedfa.cupy"


# --- sdpa_forward with CuPy arrays and no stream: CuPy's current stream ----------------------------

def test_cupy_arrays_decide_the_call_stream_as_cupys_current(monkeypatch, cupy_module):
    """CuPy has no DLPack exchange API; the core asks CuPy for its current stream instead, runs on
    it and hands it to every producer, so CuPy arrays need no cross-stream event."""
    cupy = cupy_module
    import stridedfa
    from helpers.fake_dlpack import FakeTensor

    class CupyLike(FakeTensor):  # a producer whose type lives in CuPy's namespace
        pass

    CupyLike.__module__ = "cupy._core.core"

    class Current:
        ptr = 0x6000

    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda *args: Current())
    q = CupyLike((1, 2, 16, 64), dtype="float16")
    seen = stridedfa._core._inspect_dlpack(q)
    assert seen["stream"] == 0x6000 and q.streams == [0x6000]

    other = FakeTensor((1, 2, 16, 64), dtype="float16")  # not CuPy: the legacy default stream
    assert stridedfa._core._inspect_dlpack(other)["stream"] == 0 and other.streams == [1]
    explicit = CupyLike((1, 2, 16, 64), dtype="float16")  # an explicit stream wins
    assert stridedfa._core._inspect_dlpack(explicit, stream=0x9000)["stream"] == 0x9000
