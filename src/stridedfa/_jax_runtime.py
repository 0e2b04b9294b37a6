"""What stridedfa.jax's calls share: JAX itself (imported here, checked for a usable version),
the XLA FFI targets' names and registration, the handlers' attribute codes, the static options of a
call, and loading cuDNN for the core once JAX's GPU backend is up. stridedfa.jax (dense attention)
and stridedfa._jax_varlen (variable-length attention) build on it.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

import numpy as np

from stridedfa import _core
from stridedfa._errors import LayoutError

# Built against jaxlib 0.6.2's FFI headers (see pyproject.toml): XLA runs handlers built against
# older FFI headers, not newer ones, and jax.ffi.ffi_call with vmap_method is needed.
MIN_JAX_VERSION = (0, 6, 2)


def _version_tuple(text: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in match.groups()) if match else (0,)


def _import_jax():
    needed = ".".join(map(str, MIN_JAX_VERSION))
    try:
        import jax
    except ImportError as error:
        raise ImportError(
            f"stridedfa.jax needs JAX >= {needed} with its CUDA backend, which could not be imported "
            f"({error}). Install it with: pip install -U 'jax[cuda13]'") from error
    found = getattr(jax, "__version__", "unknown")
    try:
        from jax import ffi
    except ImportError:
        ffi = None
    if (_version_tuple(found) < MIN_JAX_VERSION or ffi is None
            or not all(hasattr(ffi, name) for name in ("ffi_call", "register_ffi_target"))):
        raise ImportError(
            f"stridedfa.jax needs JAX >= {needed} (for jax.ffi.ffi_call and "
            f"jax.ffi.register_ffi_target); found jax {found}. Upgrade with: "
            f"pip install -U 'jax[cuda13]'")
    import jax.numpy
    return jax


jax = _import_jax()
jnp = jax.numpy


_LAYOUTS = {"bshd": 0, "bhsd": 1}  # the handlers' `layout` attribute (cpp/include/stridedfa/jax_ffi.hpp)
_DTYPES = ("float16", "bfloat16")
_FORWARD = "stridedfa_sdpa_forward"  # (q, k, v) -> (out, lse)
_FORWARD_INFERENCE = "stridedfa_sdpa_forward_inference"  # (q, k, v) -> out
_BACKWARD = "stridedfa_sdpa_backward"  # (q, k, v, out, lse, grad_out) -> (grad_q, grad_k, grad_v)
# The handlers' `optional_operands` attribute: which optional operands follow those above, one bit
# each (1 << the operand's slot in the core's operand table, jax_ffi.hpp optional_operands), in the
# table's order; and whether the backward returns grad_sinks and grad_bias (after grad_v, in that
# order; sinks or a bias that are not differentiated get none). The ALiBi slopes and dropout's
# rng_state are inputs of both and have no gradient.
_BITS = _core._jax_optional_operands()
_WITH_LENGTHS, _WITH_SINKS, _WITH_BIAS, _WITH_GRAD_BIAS = _BITS["lengths"], _BITS["sinks"], _BITS["bias"], \
    _BITS["grad_bias"]
_WITH_ALIBI_SLOPES, _WITH_RNG_STATE, _WITH_GRAD_SINKS = _BITS["alibi_slopes"], _BITS["rng_state"], _BITS["grad_sinks"]
_WITH_CU_SEQLENS, _WITH_BLOCK_TABLE = _BITS["cu_seqlens"], _BITS["block_table"]

# Registered once per process; JAX queues them until its CUDA plugin is loaded.
for _name, _capsule in _core._jax_ffi_targets().items():
    jax.ffi.register_ffi_target(_name, _capsule, platform="CUDA", api_version=1)
del _name, _capsule


@dataclasses.dataclass(frozen=True)
class _Options:
    """The static configuration of a call (hashable: it keys JAX's caches)."""

    layout: str
    scale: float | None
    causal: bool
    causal_alignment: str
    window: tuple[int | None, int | None] | None = None
    softcap: float | None = None
    deterministic: bool = False
    padded: bool = False  # seqlens_q / seqlens_kv follow q, k, v as operands
    dropout_p: float = 0.0  # > 0: an rng_state operand follows the others

    def attributes(self, optional_operands: int = 0) -> dict[str, Any]:
        return _attributes(self.core_options(), _LAYOUTS[self.layout], optional_operands)

    def core_options(self) -> dict[str, Any]:
        """The options as the core's validation takes them."""
        return {"scale": self.scale, "causal": self.causal, "causal_alignment": self.causal_alignment,
                "window": self.window, "softcap": self.softcap, "deterministic": self.deterministic,
                "dropout_p": self.dropout_p}


# Typed NumPy scalars fix the attribute types the handlers decode (bool, f64, i64).
_WIRE_TYPES = {bool: np.bool_, float: np.float64, int: np.int64}


def _attributes(core_options: dict[str, Any], layout: int, optional_operands: int) -> dict[str, Any]:
    """The handlers' attributes: `options`, the core's own parse of the call's options as the
    fields of its SdpaOptions by name (_core._sdpa_options; the handlers decode the same field
    list), the arrays' `layout` code and the `optional_operands` bits of the operands given."""
    fields = _core._sdpa_options(**core_options)
    return {"options": {name: _WIRE_TYPES[type(value)](value) for name, value in fields.items()},
            "layout": np.int64(layout), "optional_operands": np.int64(optional_operands)}


def _rng_state(key):
    """Dropout's Philox seed and offset from a jax.random key: uint32 (4,), which the handler reads
    as the core's int64 (2,) rng_state (words 0-1 the seed, 2-3 the offset; the GPU is
    little-endian). uint32, as JAX without x64 has no int64."""
    try:
        return jax.random.bits(key, (4,), jnp.uint32)
    except (TypeError, ValueError) as error:
        raise type(error)(f"dropout_key: expected one jax.random key (jax.random.key(seed) or "
                          f"jax.random.PRNGKey(seed)): {error}") from error


def _window(window):
    """window as JAX's static options hold it: (left, right) with None unbounded (the core's parse)."""
    if window is None:
        return None
    return tuple(None if bound < 0 else bound for bound in _core._window_bounds(window))


def _options(layout, scale, causal, causal_alignment, window=None, deterministic=False, padded=False,
             softcap=None, dropout_p=0.0) -> _Options:
    """The static options of a call, parsed once by the core (_core._sdpa_options: its rules and
    words); what is JAX's own is only that they are compiled into the call, so never traced."""
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    for name, value in (("scale", scale), ("softcap", softcap), ("dropout_p", dropout_p)):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(f"{name} must be a Python number: it is compiled into the call, so it cannot be a "
                            f"traced value (pass it as a static argument of jax.jit)")
    parsed = _core._sdpa_options(scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                                 softcap=softcap, deterministic=deterministic, dropout_p=dropout_p)
    return _Options(layout, float(parsed["scale"]) if parsed["has_scale"] else None, bool(parsed["causal"]),
                    causal_alignment, _window(window), float(parsed["softcap"]) or None, bool(parsed["deterministic"]),
                    bool(padded), float(parsed["dropout_p"]))


def _check_devices(*arrays) -> None:
    """Concrete arrays (eager calls) must live on a CUDA device: XLA has no CPU kernel for this."""
    for name, x in zip(("q", "k", "v"), arrays):
        if isinstance(x, jax.core.Tracer):
            continue
        platforms = sorted({device.platform for device in x.devices()})
        if platforms != ["gpu"]:
            raise LayoutError(
                f"{name} lives on {'/'.join(platforms)}; stridedfa.jax runs on CUDA GPUs only. Move it "
                f"with jax.device_put({name}, jax.devices('gpu')[0])")


# --- Runtime ------------------------------------------------------------------------------------

_runtime_lock = threading.Lock()
_runtime_ready = False


def _ensure_runtime() -> None:
    """Loads cuDNN for the core before the first kernel runs. Done after JAX's GPU backend is up,
    so that a cuDNN JAX already loaded is the one reused. Without a JAX GPU backend (tracing or
    lowering on a CPU-only machine) there is nothing to load yet."""
    global _runtime_ready
    if _runtime_ready:
        return
    with _runtime_lock:
        if _runtime_ready:
            return
        try:
            jax.devices("gpu")
        except RuntimeError:
            return
        _core._load_libraries()  # BackendError saying what was looked for
        _runtime_ready = True
