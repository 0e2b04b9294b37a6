"""stridedfa.warm_up: the cuDNN graphs of known calls, built (or loaded from the persisted plans)
before the first of them runs."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from stridedfa import _core

_LAYOUTS = {"bshd": 0, "bhsd": 1, "thd": 2}  # the shape views' layouts (_jax_ffi.pxi, jax_ffi.hpp)
_DTYPES = ("bfloat16", "float16")
_OPTIONS = ("scale", "causal", "causal_alignment", "window", "softcap", "deterministic", "dropout_p")
_KEYS = frozenset(("q", "k", "v", "layout", "dtype", "backward", "return_lse", "padded", "sinks", "grad_sinks",
                   "alibi", "bias", "grad_bias", "sequences", "max_seqlen_q", "max_seqlen_kv", *_OPTIONS))


def warm_up(configs: Iterable[Mapping[str, Any]], *, device: int = 0) -> dict[str, Any]:
    """Gets the cuDNN graphs of these calls ready now -- loaded from the persisted plans
    (``cache_info()["persistent"]``) where an earlier process saved them, else built -- so that
    the first real call of each finds its graph in the cache: for a serving process whose first
    requests must not wait 40 ms to 1 s per configuration, or a training run that will meet every
    bucket of the variable-length path. Nothing is launched and no memory is allocated.

    Each configuration describes a call on dense arrays by shapes and options (a dict):

    - ``q``, ``k``, ``v``: shapes in ``layout``: ``"bshd"`` (default: (batch, seq, heads,
      head_dim) -- also torch's ``x.transpose(1, 2)`` of such a tensor), ``"bhsd"``, or ``"thd"``
      (variable length: (tokens, heads, head_dim), with ``sequences``, the number of sequences,
      and ``max_seqlen_q`` / ``max_seqlen_kv`` as the calls pass them). ``v`` defaults to ``k``.
    - ``dtype``: ``"bfloat16"`` (default) or ``"float16"``.
    - ``backward``: also the backward's graph (default True: training).
    - ``return_lse``: the forward computes the statistics (default: as ``backward``); a call
      without them (inference) has a graph of its own.
    - ``scale``, ``causal``, ``causal_alignment``, ``window``, ``softcap``, ``deterministic``,
      ``dropout_p``: as in :func:`stridedfa.sdpa_forward`.
    - ``padded``: calls with padding lengths: True for one lengths tensor passed as both
      ``seqlens_q`` and ``seqlens_kv`` (self-attention, what transformers' right padding gives),
      ``"separate"`` for two tensors; the core runs the two differently (one tensor lets it align a
      bottom-right mask top-left), so they are different graphs.
    - ``sinks``, ``alibi``: calls with attention sinks / ALiBi slopes; ``grad_sinks``: the sinks
      are trained (default: with sinks and without dropout); ``bias``: the bias' shape, with
      ``grad_bias`` when its gradient is computed.

    A variable-length call is keyed by buckets of its token and sequence counts
    (:func:`stridedfa.length_buckets`), so its warm-up lists one configuration per bucket. Calls on
    other strides (views of a packed projection, outputs into a larger buffer) have graphs of their
    own: their first call builds them, and the persisted plans keep them for the next process.

    Returns ``{"configurations", "graphs", "built", "loaded", "seconds"}``: how many graphs were
    prepared (a forward and, for training, a backward per configuration), how many of them had to
    be built, how many came from persisted plans (the rest were in the cache already), and the wall
    time. Raises LayoutError / UnsupportedError for a configuration the calls would be refused, as
    the call would, and ValueError / TypeError for a malformed configuration.

    Example::

        # a decoding step (one query, a 4096-token cache, inference) and a prefill
        stridedfa.warm_up([dict(q=(8, 1, 32, 128), k=(8, 4096, 8, 128), causal=True,
                                causal_alignment="bottom_right", backward=False),
                           dict(q=(1, 4096, 32, 128), k=(1, 4096, 8, 128), causal=True, backward=False)])
        # packed-document training: 16k tokens a batch, up to 64 documents
        stridedfa.warm_up([dict(q=(16384, 16, 128), k=(16384, 4, 128), layout="thd", sequences=n, causal=True)
                           for n in stridedfa.length_buckets(64)])
    """
    configs = list(configs)
    calls = [call for config in configs for call in _calls_of(config)]
    for backward, layout, shapes, dtype, options in calls:  # every configuration checked before any build
        _core._validate_shapes(backward, layout, shapes, dtype, **options)
    before = _core.cache_info()
    start = time.perf_counter()
    for backward, layout, shapes, dtype, options in calls:
        _core._warm_up_shapes(backward, layout, shapes, dtype, device, **options)
    seconds = time.perf_counter() - start
    after = _core.cache_info()
    loaded = after["persistent"]["loads"] - before["persistent"]["loads"]
    return {"configurations": len(configs), "graphs": len(calls), "built": after["builds"] - before["builds"] - loaded,
            "loaded": loaded, "seconds": seconds}


def length_buckets(up_to: int) -> list[int]:
    """The counts a variable-length call's tokens and sequences are keyed by, up to the one that
    holds ``up_to``: 8, 10, 12, 14, 16, 20, 24, ... (at least 8, else at most 1.25x the real count).
    Calls whose counts fall into one bucket share a graph."""
    if isinstance(up_to, bool) or not isinstance(up_to, int) or up_to < 1:
        raise ValueError(f"length_buckets: up_to must be a positive int, got {up_to!r}")
    buckets: list[int] = []
    n = 1
    while True:
        bucket = _core._length_bucket(n)
        if not buckets or bucket != buckets[-1]:
            buckets.append(bucket)
        if bucket >= up_to:
            return buckets
        n = bucket + 1


def _calls_of(config: Mapping[str, Any]) -> list[tuple]:
    """The core calls (backward, layout, shapes, dtype, options) a configuration's warm-up makes:
    its forward, then its backward."""
    if not isinstance(config, Mapping):
        raise TypeError(f"warm_up: each configuration is a dict of shapes and options, got {type(config).__name__}")
    unknown = sorted(set(config) - _KEYS)
    if unknown:
        raise TypeError(f"warm_up: unknown configuration keys {unknown}; known: {sorted(_KEYS)}")
    if "q" not in config or "k" not in config:
        raise ValueError("warm_up: a configuration needs the shapes of q and k")
    for name in ("backward", "return_lse", "sinks", "grad_sinks", "alibi", "grad_bias"):
        if name in config and not isinstance(config[name], bool):
            raise TypeError(f"warm_up: {name} must be True or False, got {config[name]!r}")
    padded = config.get("padded", False)
    if not (isinstance(padded, bool) or (isinstance(padded, str) and padded == "separate")):
        raise ValueError(f"warm_up: padded must be False, True (one lengths tensor) or 'separate', "
                         f"got {config['padded']!r}")
    layout = config.get("layout", "bshd")
    if layout not in _LAYOUTS:
        raise ValueError(f"warm_up: layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
    dtype = config.get("dtype", "bfloat16")
    if dtype not in _DTYPES:
        raise ValueError(f"warm_up: dtype must be one of {_DTYPES}, got {dtype!r}")
    q, k = _shape(config["q"], "q"), _shape(config["k"], "k")
    v = _shape(config.get("v", k), "v")
    backward = bool(config.get("backward", True))
    with_lse = bool(config.get("return_lse", backward)) or backward
    options = {name: config[name] for name in _OPTIONS if name in config}
    options.update(_operands(config, q, layout))
    out = (*q[:-1], v[-1])
    lse = _lse_shape(q, layout) if with_lse else None
    calls: list[tuple] = [(False, _LAYOUTS[layout], (q, k, v, out, lse), dtype, options)]
    if backward:
        calls.append((True, _LAYOUTS[layout], (q, k, v, out, lse, out, q, k, v), dtype, options))
    return calls


def _shape(value, name: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(n) for n in value)
    except TypeError:
        raise TypeError(f"warm_up: {name} must be a shape (a tuple of ints), got {value!r}") from None
    return shape


def _lse_shape(q: tuple[int, ...], layout: str) -> tuple[int, ...]:
    if layout == "thd":
        return q[:2]  # (tokens, heads)
    b, h, s = (q[0], q[2], q[1]) if layout == "bshd" else q[:3]
    return (b, h, s)


def _heads(q: tuple[int, ...], layout: str) -> int:
    return q[1] if layout in ("bhsd", "thd") else q[2]


def _operands(config: Mapping[str, Any], q: tuple[int, ...], layout: str) -> dict[str, Any]:
    """The optional operands' (shape, dtype) pairs the shape views take."""
    operands: dict[str, Any] = {}
    dtype = config.get("dtype", "bfloat16")
    if layout == "thd":
        sequences = config.get("sequences")
        if isinstance(sequences, bool) or not isinstance(sequences, int) or sequences < 1:
            raise ValueError(f"warm_up: a variable-length (thd) configuration needs sequences, the number of sequences "
                             f"(a positive int), got {sequences!r}")
        cu = ((sequences + 1,), "int32")
        operands.update(cu_seqlens=(cu, cu), max_seqlen_q=config.get("max_seqlen_q"),
                        max_seqlen_kv=config.get("max_seqlen_kv"))
    elif "sequences" in config or "max_seqlen_q" in config or "max_seqlen_kv" in config:
        raise ValueError("warm_up: sequences and max_seqlen_q / max_seqlen_kv are for layout 'thd'")
    if config.get("padded"):
        operands["lengths"] = (((q[0],), "int32"), ((q[0],), "int32"))
        operands["shared_lengths"] = config["padded"] is True
    if config.get("sinks"):
        operands["sinks"] = ((_heads(q, layout),), "float32")
        # trainable sinks with dropout are refused (cuDNN 9.19 gets their gradient wrong)
        operands["grad_sinks"] = config.get("grad_sinks", not config.get("dropout_p"))
    if config.get("alibi"):
        operands["alibi_slopes"] = ((_heads(q, layout),), "float32")
    if config.get("bias") is not None:
        operands["bias"] = (_shape(config["bias"], "bias"), dtype)
        operands["grad_bias"] = bool(config.get("grad_bias", False))
    if config.get("dropout_p"):
        operands["rng_state"] = ((2,), "int64")
    return operands
