"""stridedfa.attention: one entry point for every DLPack producer.

The adapter is chosen by the type of q, without importing any framework: a type can only be a
torch.Tensor, cupy.ndarray or jax.Array if that framework is already imported (``sys.modules``).
k and v may come from other producers; the core's intake reads them as they are.
"""

from __future__ import annotations

import importlib
import inspect
import sys

from stridedfa import _core

__all__ = ["attention", "varlen_attention"]

# kind -> (framework module, its array type's attribute, stridedfa adapter module)
_FRAMEWORKS = {
    "torch": ("torch", "Tensor", "stridedfa.torch"),
    "cupy": ("cupy", "ndarray", "stridedfa.cupy"),
    "jax": ("jax", "Array", "stridedfa.jax"),
}
_GENERIC_OPTIONS = frozenset({"scale", "causal", "causal_alignment", "window", "softcap", "seqlens_q",
                              "seqlens_kv", "sinks", "bias", "alibi_slopes", "dropout_p", "rng_state",
                              "return_lse", "stream"})

_kind_by_type: dict[type, str] = {}  # type(q) -> "torch" | "cupy" | "jax" | "dlpack"
_options_by_function: dict[object, frozenset] = {}


def attention(q, k, v, **options):
    """Scaled-dot-product attention forward for any DLPack tensors; outputs are allocated for you.

    Logical axes are (batch, heads, seq, head_dim) for every producer (as in
    :func:`stridedfa.sdpa_forward`); memory order is read from the strides. Dispatches on the type
    of ``q``:

    - ``torch.Tensor`` -> :func:`stridedfa.torch.attention` (differentiable; torch's allocator and
      current stream);
    - ``cupy.ndarray`` -> :func:`stridedfa.cupy.attention` (CuPy's pool and current stream);
    - ``jax.Array`` -> :func:`stridedfa.jax.attention` with ``layout="bhsd"`` unless ``layout`` is
      given (that adapter defaults to bshd; here the axes stay (b, h, s, d) like everywhere else);
      with ``dropout_p`` it takes a ``dropout_key`` (a ``jax.random`` key), not ``rng_state``;
    - anything else with ``__dlpack__`` -> the output is a :class:`stridedfa.DeviceBuffer`
      allocated on the call's stream, which ``torch.from_dlpack``, ``cupy.from_dlpack`` and
      ``jax.dlpack.from_dlpack`` import without a copy. Options: ``scale``, ``causal``,
      ``causal_alignment``, ``window``, ``softcap``, ``seqlens_q``, ``seqlens_kv``, ``sinks``, ``bias``,
      ``alibi_slopes``, ``dropout_p`` and ``rng_state`` (needed with dropout), as in
      :func:`stridedfa.sdpa_forward`, ``return_lse`` (then ``(out, lse)`` is returned) and ``stream`` (an int
      handle or an object with ``__cuda_stream__``; by default the producer's current work stream
      where it exports the DLPack C exchange API, else the legacy default stream).

    Options are passed on to the adapter; one it does not take raises TypeError, as does a q that
    is no DLPack tensor. Tensors that are not on a CUDA device raise :class:`stridedfa.LayoutError`.
    """
    kind = _kind_by_type.get(type(q))
    if kind is None:
        kind = _classify(q)
    if kind == "dlpack":
        if not options:  # the common call: no option lookups
            return _core._attention_generic(q, k, v, None, False, "top_left", False, None)
        unknown = options.keys() - _GENERIC_OPTIONS
        if unknown:
            raise TypeError(_unknown_options(unknown, "stridedfa.attention for generic DLPack "
                                             "producers", _GENERIC_OPTIONS))
        return _core._attention_generic(
            q, k, v, options.get("scale"), options.get("causal", False),
            options.get("causal_alignment", "top_left"), options.get("return_lse", False),
            options.get("stream"), options.get("window"), options.get("softcap"), options.get("seqlens_q"),
            options.get("seqlens_kv"), options.get("sinks"), options.get("bias"), options.get("alibi_slopes"),
            options.get("dropout_p", 0.0), options.get("rng_state"))
    adapter = _adapter(kind)
    function = adapter.attention
    accepted = _options_by_function.get(function)
    if accepted is None:
        accepted = _options_by_function[function] = _keyword_options(function)
    unknown = options.keys() - accepted if options and accepted is not _ANY else ()
    if unknown:
        raise TypeError(_unknown_options(unknown, f"{_FRAMEWORKS[kind][2]}.attention", accepted))
    if kind == "jax" and "layout" not in options:
        options["layout"] = "bhsd"
    return function(q, k, v, **options)


_VARLEN_GENERIC_OPTIONS = frozenset({"scale", "causal", "causal_alignment", "window", "softcap", "sinks",
                                     "dropout_p", "rng_state", "return_lse", "stream"})


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q=None, max_seqlen_kv=None, **options):
    """Attention over sequences packed along one token axis (THD) for any DLPack tensors.

    q (total_q, h_q, d_qk), k (total_kv, h_kv, d_qk), v (total_kv, h_kv, d_v), int32
    ``cu_seqlens_q`` / ``cu_seqlens_kv`` (b + 1,) on the device; ``max_seqlen_*`` optional Python
    ints (see :func:`stridedfa.torch.varlen_attention`). Dispatches on the type of ``q`` to
    ``stridedfa.torch`` / ``stridedfa.cupy`` / ``stridedfa.jax``'s ``varlen_attention``; any
    other DLPack producer gets ``out`` (and with ``return_lse`` the (h_q, total_q) ``lse``) as
    :class:`stridedfa.DeviceBuffer` s, with the options ``scale``, ``causal``,
    ``causal_alignment``, ``window``, ``softcap``, ``sinks``, ``dropout_p`` with ``rng_state``,
    ``return_lse`` and ``stream``.
    """
    kind = _kind_by_type.get(type(q))
    if kind is None:
        kind = _classify(q)
    if kind == "dlpack":
        unknown = options.keys() - _VARLEN_GENERIC_OPTIONS
        if unknown:
            raise TypeError(_unknown_options(unknown, "stridedfa.varlen_attention for generic DLPack producers",
                                             _VARLEN_GENERIC_OPTIONS))
        return _core._varlen_generic(
            q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, options.get("scale"),
            options.get("causal", False), options.get("causal_alignment", "top_left"),
            options.get("return_lse", False), options.get("stream"), options.get("window"), options.get("softcap"),
            options.get("sinks"), options.get("dropout_p", 0.0), options.get("rng_state"))
    adapter = _adapter(kind)
    return adapter.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, **options)


def _adapter(kind: str):
    """The stridedfa adapter module for a framework kind, imported on first use."""
    name = _FRAMEWORKS[kind][2]
    module = sys.modules.get(name)
    return module if module is not None else importlib.import_module(name)


def _classify(q) -> str:
    tp = type(q)
    for kind, (module_name, type_name, _) in _FRAMEWORKS.items():  # noqa: B007 (kept after break)
        module = sys.modules.get(module_name)
        if module is None:
            continue  # not imported, so q cannot be one of its arrays
        array_type = getattr(module, type_name, None)
        if isinstance(array_type, type) and isinstance(q, array_type):
            break
    else:
        if not hasattr(q, "__dlpack__"):
            raise TypeError(
                f"stridedfa.attention: q must be a DLPack tensor (torch.Tensor, cupy.ndarray, "
                f"jax.Array or any object with __dlpack__), got {tp.__module__}.{tp.__qualname__}")
        kind = "dlpack"
    _kind_by_type[tp] = kind
    return kind


def _keyword_options(function) -> frozenset:
    """The option names an adapter's attention(q, k, v, ...) takes by keyword."""
    parameters = list(inspect.signature(function).parameters.values())[3:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return _ANY
    return frozenset(p.name for p in parameters
                     if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                   inspect.Parameter.POSITIONAL_OR_KEYWORD))


_ANY = frozenset({"**"})  # an adapter taking **options checks them itself


def _unknown_options(unknown, target, accepted) -> str:
    names = ", ".join(sorted(map(repr, unknown)))
    return f"{target} takes no option {names} (its options: {', '.join(sorted(accepted))})"
