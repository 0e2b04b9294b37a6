"""What stridedfa.jax's calls share: JAX itself (imported here, checked for a usable version),
the XLA FFI targets' names and registration, the handlers' attribute codes, the static options of a
call, and loading cuDNN for the core once JAX's GPU backend is up. stridedfa.jax (dense attention)
and stridedfa._jax_varlen (variable-length attention) build on it.
"""

from __future__ import annotations

import dataclasses
import math
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
_ALIGNMENTS = {"top_left": 0, "bottom_right": 1}
_DTYPES = ("float16", "bfloat16")
_FORWARD = "stridedfa_sdpa_forward"  # (q, k, v) -> (out, lse)
_FORWARD_INFERENCE = "stridedfa_sdpa_forward_inference"  # (q, k, v) -> out
_BACKWARD = "stridedfa_sdpa_backward"  # (q, k, v, out, lse, grad_out) -> (grad_q, grad_k, grad_v)
# The handlers' `optional_operands` attribute: which optional operands follow those above, in this
# order, and whether the backward returns grad_bias (after grad_sinks, which come with the sinks;
# sinks that are not differentiated get none). The ALiBi slopes and dropout's rng_state are inputs
# of both and have no gradient. The bits are the core's (OptionalOperand, jax_ffi.hpp).
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
        # Typed numpy scalars fix the attribute types the handlers decode (f64, bool, i64).
        left, right = (None, None) if self.window is None else self.window
        return {
            "scale": np.float64(0.0 if self.scale is None else self.scale),
            "has_scale": np.bool_(self.scale is not None),
            "causal": np.bool_(self.causal),
            "causal_alignment": np.int64(_ALIGNMENTS[self.causal_alignment]),
            "window_left": np.int64(-1 if left is None else left),
            "window_right": np.int64(-1 if right is None else right),
            "softcap": np.float64(0.0 if self.softcap is None else self.softcap),
            "deterministic": np.bool_(self.deterministic),
            "layout": np.int64(_LAYOUTS[self.layout]),
            "optional_operands": np.int64(optional_operands),
            "dropout_p": np.float64(self.dropout_p),
            "max_seqlen_q": np.int64(0),  # variable-length calls only (stridedfa._jax_varlen)
            "max_seqlen_kv": np.int64(0),
        }

    def core_options(self) -> dict[str, Any]:
        """The options as the core's validation takes them."""
        return {"scale": self.scale, "causal": self.causal, "causal_alignment": self.causal_alignment,
                "window": self.window, "softcap": self.softcap, "deterministic": self.deterministic,
                "dropout_p": self.dropout_p}


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
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}")
    if scale is not None:
        if isinstance(scale, jax.core.Tracer):
            raise TypeError("scale must be a Python number: it is compiled into the call, so it cannot be "
                            "a traced value (pass it as a static argument of jax.jit)")
        if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
            raise TypeError(f"scale must be a number or None, got {type(scale).__name__}")
        scale = float(scale)
        if not math.isfinite(scale):
            raise ValueError(f"scale must be a finite number, got {scale}")
    if softcap is not None:
        if isinstance(softcap, jax.core.Tracer):
            raise TypeError("softcap must be a Python number: it is compiled into the call")
        if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
            raise TypeError(f"softcap must be a number or None, got {type(softcap).__name__}")
        softcap = float(softcap)
        if not (softcap > 0 and math.isfinite(softcap)):
            raise ValueError(f"softcap must be a positive finite number (None: no cap), got {softcap}")
    if isinstance(dropout_p, jax.core.Tracer):
        raise TypeError("dropout_p must be a Python number: it is compiled into the call")
    if isinstance(dropout_p, (bool, np.bool_)) or not isinstance(dropout_p, (int, float, np.integer, np.floating)):
        raise TypeError(f"dropout_p must be a number in [0, 1), got {type(dropout_p).__name__}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p}")
    return _Options(layout, scale, bool(causal), causal_alignment, _window(window), softcap, bool(deterministic),
                    bool(padded), dropout_p)


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
