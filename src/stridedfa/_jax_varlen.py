"""stridedfa.jax's variable-length (THD) attention: documents packed along one token axis, through
the same XLA FFI targets as stridedfa.jax.attention with the handlers' `thd` layout and the
cu_seqlens operands (cpp/include/stridedfa/jax_ffi.hpp).

JAX's public API has padded lengths only; here q (total_q, h_q, d_qk), k (total_kv, h_kv, d_qk),
v (total_kv, h_kv, d_v) and int32 cu_seqlens (b + 1,) are the operands, differentiable in q, k, v
under jax.jit and jax.grad; jax.vmap runs the mapped calls one after another (each its own packed
batch). cu_seqlens are read on the device only: no host round trip, jit-compiled once per shape.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from stridedfa import _core
from stridedfa._errors import LayoutError
from stridedfa._jax_runtime import (
    _BACKWARD,
    _FORWARD,
    _WITH_CU_SEQLENS,
    _WITH_RNG_STATE,
    _attributes,
    _check_devices,
    _ensure_runtime,
    _Options,
    _options,
    _rng_state,
    jax,
    jnp,
)
from stridedfa._quirk_workarounds import varlen_backward_kv_heads

_THD = 2  # the handlers' `layout` code for (tokens, heads, head_dim) arrays


@dataclasses.dataclass(frozen=True)
class _VarlenOptions:
    """The static configuration of a call (hashable: it keys JAX's caches): a dense call's options
    (their layout replaced by thd) and the promised longest sequences (0: bounded by the tokens)."""

    base: _Options
    max_seqlen_q: int
    max_seqlen_kv: int

    def attributes(self, optional_operands: int) -> dict[str, Any]:
        return _attributes(self.core_options(), _THD, optional_operands)

    def core_options(self) -> dict[str, Any]:
        return dict(self.base.core_options(), max_seqlen_q=self.max_seqlen_q or None,
                    max_seqlen_kv=self.max_seqlen_kv or None)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q: int | None = None,
                     max_seqlen_kv: int | None = None, *, scale: float | None = None, causal: bool = False,
                     causal_alignment: str = "top_left", window=None, softcap: float | None = None,
                     dropout_p: float = 0.0, dropout_key=None, deterministic: bool = False,
                     return_lse: bool = False):
    """Attention over sequences packed along one token axis (THD, FlashAttention's varlen).

    Args:
        q: (total_q, h_q, d_qk) float16/bfloat16 array: every sequence's queries, one after another.
        k: (total_kv, h_kv, d_qk); h_q a multiple of h_kv (GQA). v: (total_kv, h_kv, d_v). One
            key/value head (MQA) is repeated to two (cuDNN 9.19's varlen backward gets MQA's dK
            wrong; the cotangents sum back).
        cu_seqlens_q, cu_seqlens_kv: int32 (b + 1,) arrays, 0 then the end of each sequence
            (sequence i is tokens [cu[i], cu[i + 1])), traced values read on the device only.
            Outside the contract (decreasing, past the end) they are clamped into the arrays:
            nothing outside them is read or written.
        max_seqlen_q, max_seqlen_kv: optional Python ints, the longest sequence (a promise: one
            longer than its bucket, at most 1.25x the promise, is treated as empty); None bounds it
            by the token count. Compiled into the
            call, as its bucket keys cuDNN's graph.
        scale, causal, causal_alignment, window, softcap, dropout_p, dropout_key, deterministic:
            as in :func:`stridedfa.jax.attention`, per sequence.
        return_lse: also return the float32 log-sum-exp, shape (total_q, h_q); not differentiable.

    Returns:
        out (total_q, h_q, d_v), or (out, lse). Tokens in no sequence get out = 0, lse = -inf and
        zero gradients.
    """
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if value is not None and (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))):
            raise TypeError(f"{name} must be a Python int or None (it is compiled into the call), got "
                            f"{type(value).__name__}")
        if value is not None and not 1 <= value < 2**31:
            raise ValueError(f"{name} must be in [1, 2**31) or None, got {value}")
    base = _options("bshd", scale, causal, causal_alignment, window, deterministic, softcap=softcap,
                    dropout_p=dropout_p)
    options = _VarlenOptions(base, int(max_seqlen_q or 0), int(max_seqlen_kv or 0))
    q, k, v = (jnp.asarray(x) for x in (q, k, v))
    heads = varlen_backward_kv_heads(q.shape[1], k.shape[1]) if k.ndim == 3 and q.ndim == 3 else None
    if heads is not None and heads != k.shape[1]:
        # k and v repeated (quirk varlen_backward_mqa_dk); JAX sums the heads' cotangents back
        k, v = jnp.repeat(k, heads, axis=1), jnp.repeat(v, heads, axis=1)
    cu_q, cu_kv = jnp.asarray(cu_seqlens_q), jnp.asarray(cu_seqlens_kv)
    rng_state: tuple = ()
    if options.base.dropout_p > 0:
        if dropout_key is None:
            raise ValueError("dropout_p > 0 needs dropout_key (a jax.random key), which picks the mask")
        rng_state = (_rng_state(dropout_key),)
    _check_shapes(q, k, v, cu_q, cu_kv, rng_state, options)
    _check_devices(q, k, v)
    _ensure_runtime()
    out, lse = _varlen(q, k, v, cu_q, cu_kv, rng_state, options)
    return (out, lse) if return_lse else out


def _check_shapes(q, k, v, cu_q, cu_kv, rng_state, options: _VarlenOptions) -> None:
    """What shapes and dtypes say, in the caller's terms, then the core's validation of the views
    the handler will build (while tracing: a bad call never reaches XLA)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 3:
            raise LayoutError(f"{name}: expected (tokens, heads, head_dim), got shape {tuple(x.shape)}")
    out_shape = (q.shape[0], q.shape[1], v.shape[2])
    _core._validate_shapes(False, _THD, (tuple(q.shape), tuple(k.shape), tuple(v.shape), out_shape,
                                      (q.shape[0], q.shape[1])),
                        (str(q.dtype), str(k.dtype), str(v.dtype), str(q.dtype), "float32"),
                        cu_seqlens=((tuple(cu_q.shape), str(cu_q.dtype)), (tuple(cu_kv.shape), str(cu_kv.dtype))),
                        rng_state=(tuple(rng_state[0].shape), str(rng_state[0].dtype)) if rng_state else None,
                        **options.core_options())


def _call(target, results, args, attributes):
    # vmap: the mapped calls run one after another, each on its own packed batch.
    return jax.ffi.ffi_call(target, results, vmap_method="sequential")(*args, **attributes)


def _forward(q, k, v, cu_q, cu_kv, rng_state, options: _VarlenOptions):
    results = (jax.ShapeDtypeStruct((q.shape[0], q.shape[1], v.shape[2]), q.dtype),
               jax.ShapeDtypeStruct((q.shape[0], q.shape[1]), jnp.float32))
    optional = _WITH_CU_SEQLENS | (_WITH_RNG_STATE if rng_state else 0)
    return _call(_FORWARD, results, (q, k, v, *rng_state, cu_q, cu_kv), options.attributes(optional))


# rng_state (dropout's Philox state) is a residual, so that the backward draws the forward's mask;
# cu_seqlens and rng_state get no cotangent.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _varlen(q, k, v, cu_q, cu_kv, rng_state, options: _VarlenOptions):
    return _forward(q, k, v, cu_q, cu_kv, rng_state, options)


def _varlen_fwd(q, k, v, cu_q, cu_kv, rng_state, options: _VarlenOptions):
    out, lse = _forward(q, k, v, cu_q, cu_kv, rng_state, options)
    return (out, lse), (q, k, v, cu_q, cu_kv, rng_state, out, lse)


def _varlen_bwd(options: _VarlenOptions, residuals, cotangents):
    q, k, v, cu_q, cu_kv, rng_state, out, lse = residuals
    grad_out, _ = cotangents  # lse is not differentiable
    grad_out = jnp.zeros_like(out) if grad_out is None else grad_out
    results = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    optional = _WITH_CU_SEQLENS | (_WITH_RNG_STATE if rng_state else 0)
    grads = _call(_BACKWARD, results, (q, k, v, out, lse, grad_out.astype(out.dtype), *rng_state, cu_q, cu_kv),
                  options.attributes(optional))
    zero_int = tuple(np.zeros(x.shape, jax.dtypes.float0) for x in (cu_q, cu_kv))
    rng_cotangent = tuple(np.zeros(x.shape, jax.dtypes.float0) for x in rng_state)
    return (*grads, *zero_int, rng_cotangent)


_varlen.defvjp(_varlen_fwd, _varlen_bwd)
