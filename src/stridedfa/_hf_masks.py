"""The mask side of the transformers integration: what transformers' mask machinery asks for,
turned into something stridedfa's kernels run without a materialised (b, 1, s_q, s_kv) mask.

transformers builds each mask from a *mask function* (causal, bidirectional, sliding window, packed
documents, ...) and a 2D padding mask, and calls the mask function registered for the model's
attention implementation. :func:`stridedfa_mask` recognises the mask functions stridedfa can
express by its options. By default it never reads a padding mask's values on the host, so that a
training step never waits for the device (transformers' SDPA path reads ``padding_mask.all()``):

- ``"full"``: no padding -- the options alone (causal or not, a window) describe the mask;
- ``"masked"``: the keys' padding as a (b, 1, 1, s_kv) bias beside the options, exact for any
  padding mask (holes too); without a cache each row also stops at its last real token, found on
  the device (right padding's work skipped). It also runs inside torch.compile and CUDA graphs.
  The one read: a decoding step outside autograd (generation) asks whether its mask has any
  padding, as SDPA's path does, and runs as ``"full"`` when it has none;
- ``"packed"``: documents packed along one row (``position_ids`` restarting at 0) -- the
  variable-length path with one sequence per document, cut on the host from the ids (a
  collator's ``cu_seq_lens_q`` / ``cu_seq_lens_k`` avoid that read).

With ``settings["padding_check"]`` on (:func:`stridedfa.transformers.set_padding_check`), each
padding mask is read once on the host (one small copy per forward and mask type -- two for models
with full and sliding layers), which also skips left padding's work. A padding mask is the keys';
queries are cut with it only under a causal pattern (self-attention), never under a bidirectional
one, which may be cross-attention:

- ``"lengths"``: each row's real tokens form a prefix (right padding) -- ``seqlens_q`` /
  ``seqlens_kv`` on the padded tensors, causal aligned per sequence;
- ``"runs"``: each row's real tokens form one run (left padding) -- the variable-length path,
  each row cut into (padding, real, padding) sequences so that no token attends across;
- holes (not one run per row): transformers' mask, below.

Everything else gets transformers' own boolean 4D mask, which the attention function adds as a
bias: always correct, as fast as SDPA with a mask. That is overlays such as Gemma 3's image
blocks, static caches' empty slots past the last query, masks a model edits (Falcon's ALiBi), and
with the check on holes in a padding mask and traced or captured code (where it cannot be read).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import masking_utils as _mu

from stridedfa._torch_varlen import cut_rows

__all__ = ["StridedMask", "stridedfa_mask", "mask_pattern", "settings"]

# "padding_check": never read a padding mask on the host ("masked" below: exact for any padding mask,
# no host copy; the default, so that a training step never waits for the device), or read each
# once to pick a path that also skips left padding's work (the variable-length path).
settings = {"padding_check": False}


class StridedMask:
    """What :func:`stridedfa_mask` hands each attention layer in place of a 4D mask.

    Attributes:
        kind: "full", "lengths", "runs" or "packed" (see the module's text).
        causal, window: the pattern of the mask function: causal or bidirectional, and the
            window as stridedfa's ``(left, right)`` or None.
        seqlens_q, seqlens_kv: int32 (b,) device tensors ("lengths").
        cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv: the variable-length cut of the
            flattened (b * s) token axis ("runs", "packed").
    """

    __slots__ = ("kind", "causal", "window", "seqlens_q", "seqlens_kv", "cu_seqlens_q", "cu_seqlens_kv",
                 "max_seqlen_q", "max_seqlen_kv", "key_mask", "rows_seen", "_sdpa_args", "_dense", "_bias")

    seqlens_q: torch.Tensor | None
    seqlens_kv: torch.Tensor | None
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_kv: torch.Tensor | None
    max_seqlen_q: int | None
    max_seqlen_kv: int | None
    key_mask: torch.Tensor | None
    # (b, s_q) boolean where some query rows see no key under transformers' mask (left padding):
    # their output is then 0, as torch's SDPA gives such rows, whatever the path computed there.
    rows_seen: torch.Tensor | None

    # transformers' mask code sees a mask built in advance (generate() builds a static cache's
    # masks before the forward) as 4D and hands it to the mask function again, which returns it.
    ndim = 4
    # What transformers' own mask would be; model code reads it (and .device, .to()) off the mask.
    dtype = torch.bool

    @property
    def device(self) -> torch.device:
        for t in (self.seqlens_q, self.seqlens_kv, self.cu_seqlens_q, self.key_mask):
            if t is not None:
                return t.device
        return torch.device(self._sdpa_args.get("device", "cpu"))

    def to(self, *args, **kwargs):
        """As ``Tensor.to``: this mask where neither the device nor the dtype changes, else
        transformers' dense mask converted (e.g. to a float mask for model code that adds it)."""
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        here = self.device
        same_device = device is None or (device.type == here.type and device.index in (None, here.index))
        if same_device and dtype in (None, torch.bool):
            return self
        return self.dense().to(*args, **kwargs)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        args = self._sdpa_args
        return (args["batch_size"], 1, args["q_length"], args["kv_length"])

    def __init__(self, kind: str, causal: bool, window, sdpa_args: dict, **tensors):
        self.kind, self.causal, self.window, self._sdpa_args = kind, causal, window, sdpa_args
        for name in ("seqlens_q", "seqlens_kv", "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv",
                     "key_mask", "rows_seen"):
            setattr(self, name, tensors.get(name))
        self._dense: torch.Tensor | None = None
        self._bias: dict = {}

    def dense(self) -> torch.Tensor:
        """transformers' boolean (b, 1, s_q, s_kv) mask for the same call (True: attend), built once."""
        if self._dense is None:
            self._dense = general_mask(self._sdpa_args)
        return self._dense

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as an additive bias in ``dtype``, built once per dtype: (b, 1, 1, s_kv) from the
        keys' padding for "masked", else transformers' dense mask."""
        if dtype not in self._bias:
            keys = self.key_mask
            self._bias[dtype] = (bias_from_mask(keys[:, None, None, :], dtype) if keys is not None
                                 else bias_from_mask(self.dense(), dtype))
        return self._bias[dtype]

    def __getitem__(self, index):
        """Models that index their mask (DeepSeek's sparse attention) index transformers' mask."""
        return self.dense()[index]

    def __repr__(self) -> str:
        return f"StridedMask(kind={self.kind!r}, causal={self.causal}, window={self.window})"


def general_mask(sdpa_args: dict) -> torch.Tensor:
    """transformers' own boolean 4D mask (never None: no is_causal shortcut)."""
    mask = _mu.sdpa_mask(**{**sdpa_args, "allow_is_causal_skip": False, "allow_is_bidirectional_skip": False})
    assert mask is not None, "sdpa_mask without its shortcuts always builds the mask"
    return mask


def bias_from_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: attend) as an additive bias. Masked scores get the dtype's lowest
    finite value rather than -inf, as transformers' eager masks do: a row with no key left (a
    padding query) then averages its values instead of producing NaN, whose gradient would
    poison every parameter even though the loss never reads that row."""
    if mask.dtype != torch.bool:  # a float mask: its lowest values may be -inf in a narrower dtype
        return mask.to(dtype).clamp_min(torch.finfo(dtype).min)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


# --- Recognising mask functions -------------------------------------------------------------------

def _name(fn) -> str:
    return getattr(fn, "__qualname__", "")


def _free_vars(fn) -> dict[str, Any]:
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def mask_pattern(fn) -> tuple[bool, tuple | None, torch.Tensor | None] | None:
    """(causal, window, packed document ids) for the mask functions stridedfa expresses by its
    options; None for any other (handled through transformers' dense mask). Recognised by the
    names transformers gives its mask factories' closures (transformers 5.17 to 5.25); a name that
    changes only costs the fast path, never correctness.

    transformers' sliding window ``kv_idx > q_idx - w`` is ``window=(w - 1, 0)``; its bidirectional
    window ``|q_idx - kv_idx| <= w`` is ``window=(w, w)``. Packed documents come as the positions
    remapped per document, intersected with "same document"."""
    if fn is _mu.causal_mask_function:
        return True, None, None
    if fn is _mu.bidirectional_mask_function:
        return False, None, None
    if _name(fn) != "and_masks.<locals>.and_mask":
        return None
    parts = _free_vars(fn).get("mask_functions", ())
    if len(parts) != 2:
        return None
    first, second = parts
    if _name(first) == "sliding_window_overlay.<locals>.inner_mask" and second is _mu.causal_mask_function:
        width = int(_free_vars(first)["sliding_window"])
        return True, (width - 1, 0), None
    if (_name(first) == "sliding_window_bidirectional_overlay.<locals>.inner_mask"
            and second is _mu.bidirectional_mask_function):
        width = int(_free_vars(first)["sliding_window"])
        return False, (width, width), None
    if _name(second) == "packed_sequence_mask_function.<locals>.inner_mask":
        # transformers >= 5.2x also remaps the positions per document (the same mask for causal
        # and windowed patterns, whose documents are contiguous); earlier versions do not
        if _name(first) == "remap_positions_for_packed_sequence.<locals>.inner_mask":
            first = _free_vars(first)["mask_function"]
        base = mask_pattern(first)
        if base is not None and base[2] is None:
            return base[0], base[1], _free_vars(second)["packed_sequence_mask"]
    return None


# --- The registered mask function -----------------------------------------------------------------

def _cannot_read_values() -> bool:
    """Inside torch.compile or a CUDA-graph capture the padding cannot be read on the host."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def stridedfa_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                   mask_function=_mu.causal_mask_function, attention_mask: torch.Tensor | None = None,
                   **kwargs):
    """transformers' mask function for ``attn_implementation="stridedfa"`` (registered with its
    AttentionMaskInterface): a :class:`StridedMask` where the options can express the mask, else
    transformers' boolean 4D mask. Same arguments as ``transformers.masking_utils.sdpa_mask``."""
    if isinstance(attention_mask, StridedMask):  # built in advance (see StridedMask.ndim)
        return attention_mask
    sdpa_args = dict(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, **kwargs)
    pattern = mask_pattern(mask_function)
    if pattern is None:
        return general_mask(sdpa_args)
    causal, window, documents = pattern
    # A model that turns off the is_causal shortcut of a plain causal mask edits the mask
    # afterwards (Falcon adds ALiBi to it, Doge its dynamic mask), so it gets the real thing; so
    # does a compilable cache's decoding step, which asks for it to keep one graph. (Bidirectional
    # and packed masks are always asked for with the shortcut off.)
    if causal and documents is None and not kwargs.get("allow_is_causal_skip", True):
        return general_mask(sdpa_args)
    # Keys past the last query: a static cache's empty slots (its offsets are tensors when it
    # decodes), which the options cannot describe.
    if not (isinstance(q_offset, int) and isinstance(kv_offset, int) and q_offset + q_length == kv_offset + kv_length):
        return general_mask(sdpa_args)
    if not settings["padding_check"] and documents is None:
        return _masked(attention_mask, causal, window, sdpa_args, batch_size, q_length, kv_length, kv_offset)
    if _cannot_read_values():
        if attention_mask is None and documents is None:
            return StridedMask("full", causal, window, sdpa_args)
        return general_mask(sdpa_args)
    if documents is not None:
        return _packed(documents, causal, window, sdpa_args, q_length, kv_length)
    return _padding(attention_mask, causal, window, sdpa_args, batch_size, q_length, kv_length, kv_offset)


def _packed(documents: torch.Tensor, causal, window, sdpa_args, q_length: int, kv_length: int):
    """Documents packed along each row (transformers only detects them with q_length == kv_length
    and no cache): one variable-length sequence per document, cut on the host from the ids."""
    if q_length != kv_length:
        return general_mask(sdpa_args)
    ids = documents.expand(sdpa_args["batch_size"], -1).to("cpu", torch.int64)  # the one host copy
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    flat = torch.nonzero(starts.reshape(-1)).reshape(-1)
    cu = torch.cat([flat, torch.tensor([ids.numel()])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    cu = cu.to(documents.device, non_blocking=True)
    return StridedMask("packed", causal, window, sdpa_args, cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                       max_seqlen_kv=longest)


def _masked(attention_mask, causal, window, sdpa_args, batch: int, q_length: int, kv_length: int, kv_offset: int):
    """The padding without reading it on the host: the keys' padding as a (b, 1, 1, s_kv) bias
    beside the options, exact for any padding mask (holes too) since transformers' mask is the
    pattern and the keys' padding. Without a cache (s_q = s_kv) the keys stop at each row's last
    real token (seqlens_kv); query rows that see no real key give 0, as under SDPA (rows_seen)."""
    if attention_mask is None:
        return StridedMask("full", causal, window, sdpa_args)
    keep = _keys_kept(attention_mask, batch, kv_length, kv_offset)
    if causal and q_length != kv_length:  # a cache: the causal diagonal stays the batch's (bias with
        # lengths takes none other). A decoding step outside autograd asks whether there is padding
        # at all, as transformers' SDPA path does (one host read per step): without it the step runs
        # on the options alone -- no bias, and decoding by heads' one graph per doubling of the cache
        # instead of a graph per step. Training steps and traced or captured code never read.
        if not torch.is_grad_enabled() and not _cannot_read_values() and bool(keep.all()):
            return StridedMask("full", causal, window, sdpa_args)
        return StridedMask("masked", causal, window, sdpa_args, key_mask=keep)
    positions = torch.arange(1, kv_length + 1, device=keep.device)
    ends = _on((keep * positions).amax(1), keep.device)  # each row's last real token + 1 (0: none)
    if q_length != kv_length:  # cross-attention: the keys' lengths only
        return StridedMask("masked", causal, window, sdpa_args, key_mask=keep, seqlens_kv=ends)
    # Padded query rows keep SDPA's values: a row that sees some real key attends those, one that
    # sees none (before a causal row's first real token, or a window over padding alone) gives 0.
    return StridedMask("masked", causal, window, sdpa_args, key_mask=keep, seqlens_kv=ends,
                       rows_seen=_rows_seen(keep, causal, window))


def _rows_seen(keep: torch.Tensor, causal: bool, window) -> torch.Tensor | None:
    """(b, s) boolean for self-attention over the padding ``keep`` (b, s): the query rows that see
    some real key under the pattern, i.e. keys [i - left, i + right] (right = 0 when causal). None
    where every row of a sequence with a real token sees one (bidirectional without a window)."""
    if window is None:
        return keep.cumsum(1) > 0 if causal else None
    length = keep.shape[1]
    left, right = window[0], 0 if causal else window[1]
    before = torch.nn.functional.pad(keep.cumsum(1), (1, 0))  # before[:, j]: real keys before key j
    rows = torch.arange(length, device=keep.device)
    return before[:, (rows + right + 1).clamp(max=length)] > before[:, (rows - left).clamp(min=0)]


def _padding(attention_mask, causal, window, sdpa_args, batch: int, q_length: int, kv_length: int, kv_offset: int):
    """Classify a 2D padding mask (one host copy of a few numbers per row)."""
    if attention_mask is None:
        return StridedMask("full", causal, window, sdpa_args)
    keep = _keys_kept(attention_mask, batch, kv_length, kv_offset)
    # The padding mask is the keys'. With a causal pattern the queries are the last keys (self-
    # attention), so it is theirs too; a bidirectional one may be cross-attention, whose queries
    # are another sequence: every query row is kept then.
    keep_q = keep[:, kv_length - q_length:] if causal else torch.ones_like(keep[:, :q_length])
    device = keep.device
    stats = torch.stack([*_run(keep), *_run(keep_q)], dim=1).cpu()  # the one host copy: (b, 6)
    n_kv, start_kv, runs_kv, n_q, start_q, runs_q = stats.unbind(1)
    if bool((runs_kv > 1).any() | (runs_q > 1).any()):
        return general_mask(sdpa_args)  # holes: not one run per row
    real = n_q > 0
    # Causal: the real queries must end where the real keys end (their last query is their last
    # key): then causal aligned bottom-right within the run is "kv position <= q position".
    if causal and bool((kv_length - q_length + start_q + n_q != start_kv + n_kv)[real].any()):
        return general_mask(sdpa_args)
    if bool((n_kv == kv_length).all() & (n_q == q_length).all()):
        return StridedMask("full", causal, window, sdpa_args)
    # Without a cache the queries are the keys: one tensor for both sides, which tells the core that
    # every sequence's diagonals coincide (its faster top-left backward).
    same = q_length == kv_length
    if bool((start_kv == 0).all() & (start_q == 0).all()):
        if not causal:  # every query row kept: the keys' lengths alone
            return StridedMask("lengths", causal, window, sdpa_args, seqlens_kv=_on(n_kv, device))
        if same:  # padded query rows see every real key, as under SDPA: the keys' lengths alone
            return StridedMask("lengths", causal, window, sdpa_args, seqlens_kv=_on(n_kv, device))
        return StridedMask("lengths", causal, window, sdpa_args, seqlens_q=_on(n_q, device),
                           seqlens_kv=_on(n_kv, device))
    # Bidirectional: every query row of a row against its keys' run, each sequence's diagonal at
    # the run's end -- a window's place only if the run ends the row (left padding).
    if not causal and window is not None and bool((start_kv + n_kv != kv_length).any()):
        return general_mask(sdpa_args)
    cut_q = _on(cut_rows(start_q, n_q, q_length), device)
    same_cut = same and causal
    # Causal: the query rows before a row's first real key see none under transformers' mask (SDPA
    # gives them 0); here they attend the padding keys of their own sequence, so they are zeroed.
    rows_seen = (keep.cumsum(1) > 0)[:, kv_length - q_length:] if causal else None
    return StridedMask("runs", causal, window, sdpa_args, cu_seqlens_q=cut_q,
                       cu_seqlens_kv=cut_q if same_cut else _on(cut_rows(start_kv, n_kv, kv_length), device),
                       max_seqlen_q=q_length, max_seqlen_kv=kv_length, rows_seen=rows_seen)


def _keys_kept(attention_mask: torch.Tensor, batch: int, kv_length: int, kv_offset: int) -> torch.Tensor:
    """(b, s_kv) boolean: which of this call's keys the 2D padding mask keeps."""
    padded = _mu.prepare_padding_mask(attention_mask.to(torch.bool), kv_length, kv_offset)
    assert padded is not None
    return padded[:, kv_offset:kv_offset + kv_length].expand(batch, -1)


def _on(values: torch.Tensor, device) -> torch.Tensor:
    return values.to(device=device, dtype=torch.int32)


def _run(keep: torch.Tensor):
    """Per row of a boolean (b, s): the number of True, the first True (0 if none), the number of
    runs of True."""
    count = keep.sum(1)
    first = keep.to(torch.int8).argmax(1)
    rises = (keep[:, 1:] & ~keep[:, :-1]).sum(1) + keep[:, 0]
    return count, first, rises
