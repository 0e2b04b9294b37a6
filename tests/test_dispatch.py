"""stridedfa.attention: which adapter gets the call, which options pass, what is refused; and the
DeviceBuffer's DLPack export (reference counting, capsule kinds, argument checks) on zero-size
buffers, which need no GPU."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import types

import numpy as np
import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _dispatch


@pytest.fixture
def fresh_caches(monkeypatch):
    """Dispatch caches per type and per adapter function; tests install fake frameworks."""
    monkeypatch.setattr(_dispatch, "_kind_by_type", {})
    monkeypatch.setattr(_dispatch, "_options_by_function", {})


def _fake_framework(monkeypatch, framework, type_name, adapter_name, signature):
    """A fake framework module (with an array type) and a fake stridedfa adapter recording calls."""
    module = types.ModuleType(framework)
    array_type = type(type_name, (), {"__module__": framework,
                                      "__dlpack__": lambda self, **kw: None})
    setattr(module, type_name, array_type)
    monkeypatch.setitem(sys.modules, framework, module)
    calls = []
    namespace = {"calls": calls}
    exec(f"def attention{signature}:\n    calls.append((q, k, v, dict(locals())))\n"
         f"    return 'result'\n", namespace)
    adapter = types.ModuleType(adapter_name)
    adapter.attention = namespace["attention"]
    monkeypatch.setitem(sys.modules, adapter_name, adapter)
    return array_type, calls


CUPY_SIGNATURE = ("(q, k, v, *, scale=None, causal=False, causal_alignment='top_left', "
                  "return_lse=False, stream=None)")
JAX_SIGNATURE = "(q, k, v, *, layout='bshd', scale=None, causal=False, causal_alignment='top_left')"
TORCH_SIGNATURE = ("(q, k, v, *, scale=None, causal=False, is_causal=None, "
                   "causal_alignment='top_left')")


def test_cupy_arrays_go_to_the_cupy_adapter(monkeypatch, fresh_caches):
    array, calls = _fake_framework(monkeypatch, "cupy", "ndarray", "stridedfa.cupy", CUPY_SIGNATURE)
    q, k, v = array(), object(), object()  # mixed producers: q decides
    assert stridedfa.attention(q, k, v, causal=True, return_lse=True) == "result"
    (got_q, got_k, got_v, options), = calls
    assert (got_q, got_k, got_v) == (q, k, v)
    assert options["causal"] is True and options["return_lse"] is True


def test_jax_arrays_keep_the_bhsd_axes_unless_a_layout_is_given(monkeypatch, fresh_caches):
    array, calls = _fake_framework(monkeypatch, "jax", "Array", "stridedfa.jax", JAX_SIGNATURE)
    stridedfa.attention(array(), array(), array(), scale=0.5)
    stridedfa.attention(array(), array(), array(), layout="bshd")
    assert calls[0][3]["layout"] == "bhsd" and calls[0][3]["scale"] == 0.5
    assert calls[1][3]["layout"] == "bshd"


def test_torch_tensors_go_to_the_torch_adapter(monkeypatch, fresh_caches):
    array, calls = _fake_framework(monkeypatch, "torch", "Tensor", "stridedfa.torch",
                                   TORCH_SIGNATURE)
    stridedfa.attention(array(), array(), array(), is_causal=True)
    assert calls and calls[0][3]["is_causal"] is True


def test_subclasses_dispatch_like_their_base(monkeypatch, fresh_caches):
    array, calls = _fake_framework(monkeypatch, "cupy", "ndarray", "stridedfa.cupy", CUPY_SIGNATURE)
    sub = type("Sub", (array,), {})
    stridedfa.attention(sub(), None, None)
    assert len(calls) == 1


@pytest.mark.parametrize("framework,type_name,adapter,signature,bad", [
    ("cupy", "ndarray", "stridedfa.cupy", CUPY_SIGNATURE, "layout"),
    ("jax", "Array", "stridedfa.jax", JAX_SIGNATURE, "stream"),
    ("torch", "Tensor", "stridedfa.torch", TORCH_SIGNATURE, "return_lse"),
])
def test_options_the_adapter_does_not_take_are_a_type_error(monkeypatch, fresh_caches, framework,
                                                            type_name, adapter, signature, bad):
    array, calls = _fake_framework(monkeypatch, framework, type_name, adapter, signature)
    with pytest.raises(TypeError, match=rf"{adapter}\.attention takes no option '{bad}'"):
        stridedfa.attention(array(), array(), array(), **{bad: 1})
    assert not calls


def test_a_framework_that_is_not_imported_is_never_consulted(monkeypatch, fresh_caches):
    # A type that merely looks like cupy's (same module and name) but is not the imported
    # cupy.ndarray goes the generic DLPack way; with no cupy imported nothing is imported either.
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    lookalike = type("ndarray", (), {"__module__": "cupy", "__dlpack__": lambda self, **kw: None})
    assert _dispatch._classify(lookalike()) == "dlpack"
    assert "cupy" not in sys.modules


def test_objects_without_dlpack_are_a_type_error(fresh_caches):
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"test_dispatch\..*Opaque"):
        stridedfa.attention(Opaque(), Opaque(), Opaque())
    with pytest.raises(TypeError, match="builtins.list"):
        stridedfa.attention([1.0], [1.0], [1.0])


def test_numpy_arrays_are_refused_as_host_memory(fresh_caches):
    q = np.ones((1, 2, 16, 64), dtype=np.float16)
    with pytest.raises(stridedfa.LayoutError, match=r"q needs a CUDA device; it lives in CPU"):
        stridedfa.attention(q, q, q)


def test_generic_producers_take_only_the_generic_options(fresh_caches):
    q = FakeTensor((1, 2, 16, 64), dtype="float16")
    with pytest.raises(TypeError, match=r"generic DLPack producers takes no option 'layout'"):
        stridedfa.attention(q, q, q, layout="bshd")
    with pytest.raises(ValueError, match="causal_alignment"):
        stridedfa.attention(q, q, q, causal_alignment="middle")
    with pytest.raises(TypeError, match="stream must be"):
        stridedfa.attention(q, q, q, stream="side")


def test_import_and_dispatch_import_no_framework():
    code = (
        "import sys, numpy as np, stridedfa\n"
        "try:\n"
        "    stridedfa.attention(np.ones((1, 1, 8, 8), np.float16), None, None)\n"
        "except stridedfa.LayoutError:\n"
        "    pass\n"
        "print(sorted(m for m in ('torch', 'cupy', 'jax', 'jaxlib') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


# --- DeviceBuffer, zero-size (no allocation, no GPU) ----------------------------------------------

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int


def _empty_buffer(**kw):
    return stridedfa._core._device_buffer((2, 0, 16, 64), (0, 1024, 64, 1), "float16", **kw)


def test_device_buffer_describes_itself():
    buf = _empty_buffer(device=3)
    assert isinstance(buf, stridedfa.DeviceBuffer)
    assert (buf.shape, buf.strides, buf.dtype, buf.device, buf.nbytes) == (
        (2, 0, 16, 64), (0, 1024, 64, 1), "float16", 3, 0)
    assert buf.__dlpack_device__() == (2, 3)
    assert "shape=(2, 0, 16, 64)" in repr(buf) and "cuda:3" in repr(buf)
    with pytest.raises(TypeError, match="created by stridedfa"):
        stridedfa.DeviceBuffer()


def test_device_buffer_capsule_kinds_follow_max_version():
    buf = _empty_buffer()
    assert _capsule_is_valid(buf.__dlpack__(max_version=(1, 3)), b"dltensor_versioned")
    assert _capsule_is_valid(buf.__dlpack__(max_version=(0, 8)), b"dltensor")
    assert _capsule_is_valid(buf.__dlpack__(), b"dltensor")


def test_every_export_holds_the_buffer_until_its_deleter_runs():
    buf = _empty_buffer()
    base = sys.getrefcount(buf)
    capsules = [buf.__dlpack__(max_version=(1, 0)), buf.__dlpack__()]
    assert sys.getrefcount(buf) == base + 2
    del capsules  # never consumed: the capsules' destructors call the deleters
    assert sys.getrefcount(buf) == base
    # consumed by stridedfa's own intake, which calls the deleter exactly once
    seen = stridedfa._core._inspect_dlpack(buf)
    assert sys.getrefcount(buf) == base
    assert seen["shape"] == (2, 0, 16, 64) and seen["dtype"] == "float16"
    assert seen["capsule"] == "versioned" and seen["device"] == (2, 0)


def test_a_consumed_capsule_is_left_to_its_consumer():
    buf = _empty_buffer()
    base = sys.getrefcount(buf)
    capsule = buf.__dlpack__(max_version=(1, 3))
    set_name = ctypes.pythonapi.PyCapsule_SetName
    set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
    set_name(capsule, b"used_dltensor_versioned")  # what a consumer does when it takes the tensor
    del capsule  # now the deleter is the consumer's to call; the buffer stays referenced
    assert sys.getrefcount(buf) == base + 1


@pytest.mark.parametrize("kwargs,error,match", [
    ({"dl_device": (1, 0)}, BufferError, "exports no copies"),
    ({"dl_device": (2, 1)}, BufferError, "exports no copies"),
    ({"copy": True}, BufferError, "copy=True"),
    ({"stream": "s"}, TypeError, "stream must be None or an int"),
    ({"stream": -2}, ValueError, "stream must be -1, 1, 2"),
])
def test_device_buffer_export_argument_errors(kwargs, error, match):
    buf = _empty_buffer()
    base = sys.getrefcount(buf)
    with pytest.raises(error, match=match):
        buf.__dlpack__(**kwargs)
    assert sys.getrefcount(buf) == base


def test_device_buffer_accepts_the_standard_streams_and_its_own_device():
    buf = _empty_buffer()
    for stream in (None, -1, 1, 2, 0x1234):
        buf.__dlpack__(stream=stream, dl_device=(2, 0), copy=False)


@pytest.mark.parametrize("options, error, message", [
    ({"window": (-1, 0)}, ValueError, "window left bound must be >= 0"),
    ({"window": 3}, TypeError, "pair"),
    ({"softcap": -1.0}, ValueError, "softcap"),
    ({"causal_alignment": "middle"}, ValueError, "causal_alignment"),
])
def test_generic_producers_get_the_variants_options_checked(options, error, message):
    """stridedfa.attention passes the variants' options to the core for any DLPack producer; a bad
    one is refused before any tensor is read or memory allocated."""
    q = FakeTensor((2, 4, 64, 64), None, "bfloat16")
    with pytest.raises(error, match=message):
        stridedfa.attention(q, q, q, **options)


def test_generic_producers_take_every_variant_option_by_name():
    assert {"window", "softcap", "seqlens_q", "seqlens_kv", "sinks"} <= _dispatch._GENERIC_OPTIONS
