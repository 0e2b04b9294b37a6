"""Hugging Face transformers on stridedfa: ``attn_implementation="stridedfa"``.

::

    import stridedfa.transformers   # registers "stridedfa" with transformers
    model = AutoModelForCausalLM.from_config(config, attn_implementation="stridedfa")
    model.set_attn_implementation("stridedfa")   # or switch a loaded model

Importing this module registers :func:`attention_forward` with transformers' ``AttentionInterface``
and :func:`stridedfa._hf_masks.stridedfa_mask` with its ``AttentionMaskInterface``. Both are needed:
transformers hands a custom attention function no mask at all (``attention_mask=None`` even for a
padded batch) unless a mask function is registered under the same name.

What transformers passes is mapped onto stridedfa's options: ``scaling``, causal or bidirectional
(from the mask function, else ``is_causal`` / ``module.is_causal``), ``sliding_window``,
``softcap``, ``s_aux`` (attention sinks), ``dropout``; GQA runs without repeating k and v. Padding
and packed documents run without a materialised mask (see :mod:`stridedfa._hf_masks`). By default
no padding mask is read on the host (a training step never waits for the device): the keys'
padding is a (b, 1, 1, s_kv) bias beside the options, each row's keys cut at its last real token.
``set_padding_check(True)`` reads it once per forward to run right padding through ``seqlens_q`` /
``seqlens_kv`` and left padding through the variable-length path. ``position_ids`` packing and
``cu_seq_lens_q`` / ``cu_seq_lens_k`` (DataCollatorWithFlattening, as given) run on the
variable-length path. Other masks are added as a
bias. The output is returned as (batch, seq, heads, head_dim) in
the memory cuDNN wrote, so transformers' following reshape copies nothing.

T5's learned ``position_bias`` is folded with the mask into one differentiable bias, as
transformers' SDPA path folds them. What stridedfa cannot run (CPU or float32 tensors,
``output_attentions=True``, a shape or option the kernels refuse) falls back to transformers' SDPA (eager
where SDPA lacks the option, i.e. sinks) with a warning naming the reason, once per reason;
``set_fallback("raise")`` raises :class:`stridedfa.UnsupportedError` instead, and
``with stridedfa.transformers.fallback("raise"):`` does so for a block of code. :func:`stats` counts
the calls stridedfa served and those that fell back, by reason (also in ``stridedfa.cache_info()``),
so a benchmark can tell which implementation it measured.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import warnings
from collections import Counter

import torch
import transformers

try:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import create_position_bias_mask, sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as error:  # transformers 4.x: no mask interface, other helpers
    raise ImportError(f"stridedfa.transformers needs transformers >= 5.17 (its AttentionInterface and "
                      f"AttentionMaskInterface); this is {transformers.__version__}: {error}") from error

import stridedfa.torch as _st
from stridedfa import _hf_masks
from stridedfa._errors import StridedFAError, UnsupportedError
from stridedfa._hf_masks import StridedMask, bias_from_mask, stridedfa_mask

__all__ = ["NAME", "attention_forward", "fallback", "register", "reset_stats", "set_fallback", "set_padding_check",
           "stats", "stridedfa_mask"]

NAME = "stridedfa"
_settings = {"fallback": "warn"}
_scoped_fallback: contextvars.ContextVar[str | None] = contextvars.ContextVar("stridedfa_fallback", default=None)
_warned: set[str] = set()
_served: Counter[str] = Counter()  # calls stridedfa ran, by path
_fell_back: Counter[str] = Counter()  # calls transformers' SDPA / eager ran instead, by reason


def _check_mode(mode: str, where: str) -> str:
    if mode not in ("warn", "raise"):
        raise ValueError(f"{where}: mode must be 'warn' or 'raise', got {mode!r}")
    return mode


def set_fallback(mode: str) -> None:
    """What to do with a call stridedfa cannot run: ``"warn"`` (default: run transformers' SDPA,
    warn once per reason) or ``"raise"`` (:class:`stridedfa.UnsupportedError`). :func:`fallback`
    overrides it for a block of code."""
    _settings["fallback"] = _check_mode(mode, "set_fallback")


@contextlib.contextmanager
def fallback(mode: str):
    """``with stridedfa.transformers.fallback("raise"):`` -- :func:`set_fallback`'s choice for the
    calls made inside the block only (this thread or task), e.g. to prove a benchmark or a test
    really ran on stridedfa."""
    token = _scoped_fallback.set(_check_mode(mode, "fallback"))
    try:
        yield
    finally:
        _scoped_fallback.reset(token)


def stats() -> dict:
    """What the attention function did since import (or :func:`reset_stats`): ``{"served": n,
    "served_by_path": {path: n}, "fallbacks": n, "fallback_reasons": {reason: n}}``. A call under
    torch.compile is counted when traced, not each time the compiled code runs."""
    return {"served": sum(_served.values()), "served_by_path": dict(_served), "fallbacks": sum(_fell_back.values()),
            "fallback_reasons": dict(_fell_back)}


def reset_stats() -> None:
    """Zero the counters of :func:`stats` (the warnings already given stay given)."""
    _served.clear()
    _fell_back.clear()


def _count(counter: Counter, key: str) -> None:
    if not torch.compiler.is_compiling():
        counter[key] += 1


def set_padding_check(check: bool) -> None:
    """Whether the mask function reads a padding mask on the host, once per forward (default
    False). Off, nothing is read: the keys' padding is a (b, 1, 1, s_kv) bias beside the options,
    exact for any padding mask, with each row's keys cut at its last real token (right padding's
    work skipped), so a training step never waits for the device and runs inside torch.compile and
    CUDA graphs. On, right padding runs on padding lengths and left padding on the
    variable-length path, skipping left padding's work too (e.g. left-padded prompts), at the cost
    of one synchronising read per forward; inside torch.compile and CUDA graphs transformers' 4D
    mask is used then."""
    _hf_masks.settings["padding_check"] = bool(check)


def register(name: str = NAME) -> None:
    """Register the attention and the mask function under ``name`` (done on import as "stridedfa")."""
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, stridedfa_mask)


# --- The attention function -----------------------------------------------------------------------

def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, sliding_window: int | None = None,
                      softcap: float | None = None, s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention-function signature: query (b, h_q, s_q, d), key / value
    (b, h_kv, s_kv, d), the mask from :func:`stridedfa_mask` (or a 4D mask the caller built).
    Returns (out (b, s_q, h_q, d_v), None)."""
    _refuse_what_no_path_runs(key, attention_mask, kwargs)
    reason = _cannot_run(query, kwargs)
    if reason is None:
        try:
            out, path, rows_seen = _run(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                        sliding_window, softcap, s_aux, kwargs)
            _count(_served, path)
            if rows_seen is not None:
                out = _zero_unseen_rows(out, rows_seen)
            return out, None
        except StridedFAError as error:  # raised before anything launched
            reason = f"{type(error).__name__}: {error}"
    return _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, sliding_window,
                     softcap, s_aux, kwargs)


def _zero_unseen_rows(out: torch.Tensor, rows_seen: torch.Tensor) -> torch.Tensor:
    """out (b, s_q, h, d) with the rows that see no key set to 0, as torch's SDPA gives them. The
    (b, s_q, 1, 1) complement of rows_seen is built once per mask (kept on rows_seen, which the
    layers share), so each layer adds one masked_fill."""
    if torch.compiler.is_compiling():
        return out.masked_fill(~rows_seen[:, :, None, None], 0)
    unseen = getattr(rows_seen, "_stridedfa_unseen", None)
    if unseen is None:
        unseen = rows_seen._stridedfa_unseen = ~rows_seen[:, :, None, None]  # type: ignore[attr-defined]
    return out.masked_fill(unseen, 0)


# Arguments that select keys per query (DeepSeek's sparse attention, MiniMax's block indices) or
# add per-token sinks: the models apply them only for their own eager / SDPA code, so neither
# stridedfa nor a fallback from here would honour them.
_SPARSE_ARGUMENTS = ("indices", "block_indices", "sinks")


def _refuse_what_no_path_runs(key: torch.Tensor, mask, kwargs: dict) -> None:
    for name in _SPARSE_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise UnsupportedError(f"attn_implementation='stridedfa' does not apply {name}= (the model uses it only "
                                   f"with its own eager or sdpa attention); use one of those for this model.")
    if isinstance(mask, StridedMask) and mask.shape[-1] != key.shape[2]:
        raise UnsupportedError(f"the model attends to {key.shape[2]} keys but its mask describes {mask.shape[-1]} "
                               "(it extends the mask itself, as DeepSeek-V4's compressor does, only when the mask "
                               "is a tensor); use attn_implementation 'eager' or 'sdpa' for this model.")


def _cannot_run(query: torch.Tensor, kwargs: dict) -> str | None:
    if query.device.type != "cuda":
        return f"tensors on {query.device.type}: stridedfa runs on CUDA devices"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"{query.dtype}: cuDNN's fused attention takes float16 or bfloat16"
    if kwargs.get("output_attentions"):
        return "output_attentions=True: fused attention never forms the attention weights"
    return None


def _run(module, query, key, value, mask, dropout, scaling, is_causal, sliding_window, softcap, s_aux, kwargs):
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = None if sliding_window is None else (sliding_window - 1, 0 if causal else sliding_window - 1)
    if isinstance(mask, StridedMask):  # the mask decides, as it does for SDPA and eager (a model may
        causal, window = mask.causal, mask.window  # pass sliding_window= with a windowless mask)
    options = dict(scale=scaling, causal=causal, window=window, softcap=softcap or None,
                   dropout_p=float(dropout))  # transformers passes 0.0 outside training
    sinks = None if s_aux is None else s_aux.float()
    if kwargs.get("position_bias") is not None:  # T5's learned relative positions, with their gradient
        out = _with_position_bias(query, key, value, mask, kwargs["position_bias"], causal, options, sinks)
        return out, "bias", None
    # DataCollatorWithFlattening's cu_seq_lens: authoritative, as in transformers' flash path (a
    # copy where q, k, v have no token axis: there is no mask to fall back on).
    if kwargs.get("cu_seq_lens_q") is not None:
        tokens = _tokens(query, key, value) or tuple(_flatten(t, copy=True) for t in (query, key, value))
        out = _varlen(*tokens, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], kwargs.get("max_length_q"),
                      kwargs.get("max_length_k"), options, sinks)
        return out.view(query.shape[0], query.shape[2], query.shape[1], value.shape[3]), "varlen", None
    rows_seen = mask.rows_seen if isinstance(mask, StridedMask) else None
    if mask is None or (isinstance(mask, StridedMask) and mask.kind == "full"):
        return _dense(query, key, value, options, sinks), "dense", None
    if isinstance(mask, StridedMask) and mask.kind == "lengths":
        out = _dense(query, key, value, options, sinks, seqlens_q=mask.seqlens_q, seqlens_kv=mask.seqlens_kv)
        return out, "lengths", None
    if isinstance(mask, StridedMask) and mask.kind == "masked":  # the keys' padding beside the options
        return _dense(query, key, value, options, sinks, seqlens_q=mask.seqlens_q, seqlens_kv=mask.seqlens_kv,
                      bias=mask.bias(query.dtype)), "masked", rows_seen
    if isinstance(mask, StridedMask) and mask.kind in ("runs", "packed") and not (
            sinks is not None and _training(query, key, value)):
        tokens = _tokens(query, key, value)
        if tokens is not None:
            out = _varlen(*tokens, mask.cu_seqlens_q, mask.cu_seqlens_kv, mask.max_seqlen_q, mask.max_seqlen_kv,
                          options, sinks)
            return out.view(query.shape[0], query.shape[2], query.shape[1], value.shape[3]), "varlen", rows_seen
    # A general mask (or a variable-length cut whose tensors cannot be flattened): added as a bias
    # that already holds causality and the window.
    if isinstance(mask, StridedMask):
        bias = mask.bias(query.dtype)
    else:
        bias, rows_seen = _layers_bias(mask, query.dtype)
    options.update(causal=False, window=None)
    return _dense(query, key, value, options, sinks, bias=bias), "bias", rows_seen


def _training(query, key, value) -> bool:
    """Whether the call records gradients (asked only where it matters: a decoding step's call skips it)."""
    return torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)


def _layers_bias(mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' 4D mask as an additive bias and its (b, s_q) rows that see some key, converted
    once for all the layers that share the mask (kept on the mask tensor itself, so it lives as
    long as the mask). Not while tracing, for a mask that requires grad (a graph must not be reused
    across steps), or for an inference tensor (which has no version counter to tell an edit)."""
    if torch.compiler.is_compiling() or mask.requires_grad or mask.is_inference():
        return bias_from_mask(mask, dtype), _rows_seen(mask)
    cached = getattr(mask, "_stridedfa_bias", None)
    if cached is not None and cached[0] == mask._version and cached[1] == dtype:
        return cached[2], cached[3]
    bias, rows = bias_from_mask(mask, dtype), _rows_seen(mask)
    mask._stridedfa_bias = (mask._version, dtype, bias, rows)  # type: ignore[attr-defined]
    return bias, rows


def _rows_seen(mask: torch.Tensor) -> torch.Tensor:
    """(b, s_q): the rows of a 4D mask (boolean, or additive with its dtype's lowest value or -inf
    where masked) that keep some key; broadcast over the batch where the mask is."""
    keeps = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    return keeps.any(-1).any(1)


def _with_position_bias(query, key, value, mask, position_bias, causal, options, sinks) -> torch.Tensor:
    """T5-style attention: the position bias and transformers' mask for the call folded into one
    additive bias, as transformers' SDPA path folds them (its helper), then cuDNN with that bias
    (differentiable: the position bias is learned)."""
    dense = mask.dense() if isinstance(mask, StridedMask) else mask
    bias = create_position_bias_mask(position_bias, dense, query.shape[2] > 1 and dense is None and causal, query, key)
    bias = bias.to(query.dtype)
    if bias.shape[-1] > 1 and bias.stride(-1) != 1:  # T5's (1, h, q, k), permuted from (q, k, h): cuDNN reads
        # a bias with its keys contiguous
        bias = bias.contiguous()
    options.update(causal=False, window=None)
    return _dense(query, key, value, options, sinks, bias=bias)


def _dense(query, key, value, options, sinks, **extra) -> torch.Tensor:
    # As many queries as keys: self-attention without a cache, where transformers' diagonal is the
    # top-left one (also with the keys' lengths alone); after a cache the queries are the last keys.
    alignment = "top_left" if query.shape[2] == key.shape[2] else "bottom_right"
    out = _st.attention(query, key, value, causal_alignment=alignment, sinks=sinks, **options, **extra)
    return out.transpose(1, 2)  # (b, s, h, d): q's axis order, so bshd in memory for bshd queries


def _flatten(t: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """(b, h, s, d) as (b * s, h, d) tokens: a view, or with ``copy`` a copy where none exists."""
    tokens = t.transpose(1, 2)
    shape = (t.shape[0] * t.shape[2], t.shape[1], t.shape[3])
    return tokens.reshape(shape) if copy else tokens.view(shape)


def _tokens(query, key, value):
    """query, key, value as (b * s, h, d) token-major views, or None where the strides do not allow
    one token axis (a KV cache concatenated head-major)."""
    try:
        return tuple(_flatten(t) for t in (query, key, value))
    except RuntimeError:
        return None


def _varlen(q, k, v, cu_q, cu_kv, max_q, max_kv, options, sinks) -> torch.Tensor:
    return _st.varlen_attention(q, k, v, cu_q, cu_kv, _int(max_q), _int(max_kv), causal_alignment="bottom_right",
                                sinks=sinks, **options)


def _int(value):
    return None if value is None else int(value)


# --- Falling back ---------------------------------------------------------------------------------

def _fallback(reason, module, query, key, value, mask, dropout, scaling, is_causal, sliding_window, softcap, s_aux,
              kwargs):
    if (_scoped_fallback.get() or _settings["fallback"]) == "raise":
        raise UnsupportedError(f"stridedfa attention in {type(module).__name__}: {reason} "
                               "(stridedfa.transformers.set_fallback('warn') runs transformers' SDPA instead)")
    _count(_fell_back, reason)
    needs_eager = s_aux is not None or bool(softcap)  # SDPA has neither: the model's own eager attention has
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"stridedfa: {reason}; this call runs transformers' "
                      f"{'eager attention' if needs_eager else 'SDPA'} instead (warned once per reason)",
                      stacklevel=3)
    if isinstance(mask, StridedMask):  # transformers' own mask for the call: SDPA's is_causal shortcut
        mask = mask.dense()            # would align a chunk of queries after a cache top-left
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if mask is None and (sliding_window is not None or (needs_eager and causal and query.shape[2] > 1)):
        mask = _pattern_mask(query, key, causal, sliding_window)  # SDPA's is_causal and eager know no window
    if needs_eager:
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if eager is None:
            raise UnsupportedError(f"stridedfa attention in {type(module).__name__}: {reason}, and the model has no "
                                   "eager attention to fall back on for its softcap or sinks")
        extra = {"s_aux": s_aux} if s_aux is not None else {}
        if softcap:
            extra["softcap"] = softcap
        mask = None if mask is None else bias_from_mask(mask, query.dtype)
        return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                     sliding_window=sliding_window, **extra, **kwargs)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _pattern_mask(query: torch.Tensor, key: torch.Tensor, causal: bool, sliding_window: int | None) -> torch.Tensor:
    """The boolean (1, 1, s_q, s_kv) mask that a call handed no mask stands for, as :func:`_run`
    reads it: causal aligned to the last key (queries after a cache), transformers' window
    ``kv > q - w`` (``|q - kv| < w`` without causality)."""
    s_q, s_kv = query.shape[2], key.shape[2]
    offset = s_kv - s_q
    everything = torch.ones(s_q, s_kv, dtype=torch.bool, device=query.device)
    mask = everything.tril(offset) if causal else everything
    if sliding_window is not None:
        mask = mask & ~everything.tril(offset - sliding_window)
        if not causal:
            mask = mask & everything.tril(offset + sliding_window - 1)
    return mask[None, None]


register()
