"""The transformers integration's registration and mask plumbing, on the CPU.

The attention function's kernels (stridedfa.torch.attention and varlen_attention) are replaced by
the float64 torch reference of tests/helpers/torch_ref.py with the same arguments, so that whole
models run here: every family's logits and gradients must then equal transformers' own SDPA (or
eager) path, padded left or right, packed, and in generation. That checks what this module owns --
which tensors and options each layer hands the kernels -- while tests/gpu/test_transformers.py
checks the kernels' numbers on the GPU.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import masking_utils as mu  # noqa: E402

import stridedfa.transformers as sft  # noqa: E402
from helpers import hf_models  # noqa: E402
from helpers.core_check import check_forward  # noqa: E402
from helpers.torch_ref import _attention, default_scale  # noqa: E402
from stridedfa._hf_masks import StridedMask, stridedfa_mask  # noqa: E402

FAMILIES = hf_models.available()
DECODERS = [name for name in FAMILIES if hf_models.FAMILIES[name][1] == "causal"]
ENCODERS = [name for name in FAMILIES if hf_models.FAMILIES[name][1] == "encoder"]
# SDPA refuses softcap and has no sinks: those families are compared with eager attention.
BASELINE = {"gemma2": "eager", "gpt_oss": "eager"}
# Where left padding in training takes the bias path rather than the variable-length one, and why.
LEFT_PADDED_TRAINING_BIAS = {
    "gpt_neox": "its partial rotary embedding concatenates q and k head-major: no token axis",
    "gpt_oss": "its sinks are trained, which the variable-length backward does not do",
}
# transformers' gpt_oss builds its masks without position_ids, so it never sees packed documents.
NO_PACKING = {"gpt_oss"}


class ReferenceKernels:
    """stridedfa.torch's two entry points, computed by the float64 reference (differentiable),
    recording which path each layer took."""

    def __init__(self):
        self.paths: list[str] = []
        self.dropout: list[float] = []

    def attention(self, q, k, v, *, scale=None, causal=False, causal_alignment="top_left", window=None,
                  softcap=None, seqlens_q=None, seqlens_kv=None, sinks=None, bias=None, dropout_p=0.0, **_):
        self.dropout.append(dropout_p)  # recorded, not applied: the reference has no random mask
        check_forward(q, k, v, scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                      softcap=softcap, seqlens_q=seqlens_q, seqlens_kv=seqlens_kv, sinks=sinks, bias=bias,
                      dropout_p=dropout_p)  # what the core refuses on a GPU, it refuses here
        if bias is not None and bias.shape[-2] == 1 and q.shape[2] > 1:  # the keys' padding alone
            self.paths.append("masked")
        else:
            self.paths.append("bias" if bias is not None else "lengths" if seqlens_kv is not None else "dense")
        return self._reference(q, k, v, scale, causal, causal_alignment, window, softcap, sinks, bias,
                               seqlens_q, seqlens_kv)

    def varlen(self, q, k, v, cu_q, cu_kv, max_q=None, max_kv=None, *, scale=None, causal=False,
               causal_alignment="top_left", window=None, softcap=None, sinks=None, dropout_p=0.0, **_):
        self.paths.append("varlen")
        self.dropout.append(dropout_p)
        check_forward(q, k, v, scale=scale, causal=causal, causal_alignment=causal_alignment, window=window,
                      softcap=softcap, sinks=sinks, dropout_p=dropout_p, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                      max_seqlen_q=max_q, max_seqlen_kv=max_kv)
        cq, ckv = cu_q.tolist(), cu_kv.tolist()
        pieces = []
        for i in range(len(cq) - 1):
            n_q, n_kv = cq[i + 1] - cq[i], ckv[i + 1] - ckv[i]
            if n_q == 0:
                continue
            assert max_q is None or n_q <= max_q
            if n_kv == 0:
                pieces.append(q.new_zeros(n_q, q.shape[1], v.shape[2]))
                continue
            one = [t[c[i]:c[i + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ckv), (v, ckv))]
            out = self._reference(*one, scale, causal, causal_alignment, window, softcap, sinks, None, None, None)
            pieces.append(out[0].transpose(0, 1))
        pieces.append(q.new_zeros(q.shape[0] - cq[-1], q.shape[1], v.shape[2]))
        return torch.cat(pieces)

    @staticmethod
    def _reference(q, k, v, scale, causal, alignment, window, softcap, sinks, bias, seqlens_q, seqlens_kv):
        scale = default_scale(q.shape[-1]) if scale is None else scale
        out, _ = _attention(q.double(), k.double(), v.double(), scale, causal, alignment, window, seqlens_q,
                            seqlens_kv, softcap, None if sinks is None else sinks.double(),
                            None if bias is None else bias.double())
        return out.to(q.dtype)


@pytest.fixture
def kernels(monkeypatch):
    """Run the integration's own code on the CPU with the reference in place of cuDNN. A fallback
    raises (the core refusing a call that a GPU run would refuse), unless a test asks otherwise."""
    reference = ReferenceKernels()
    monkeypatch.setitem(sft._settings, "fallback", "raise")
    monkeypatch.setattr(sft._st, "attention", reference.attention)
    monkeypatch.setattr(sft._st, "varlen_attention", reference.varlen)
    monkeypatch.setattr(sft, "_cannot_run", lambda query, kwargs: None if not kwargs.get("output_attentions")
                        else "output_attentions=True")
    return reference


def _set_padding_check(monkeypatch, check: bool) -> None:
    """set_padding_check(check) for one test; the setting comes back when the test ends."""
    monkeypatch.setitem(sft._hf_masks.settings, "padding_check", sft._hf_masks.settings["padding_check"])
    sft.set_padding_check(check)


@pytest.fixture
def padding_check(monkeypatch):
    """set_padding_check(True) for one test: padding masks read on the host to pick a path."""
    _set_padding_check(monkeypatch, True)


def _pair(name: str, seed: int = 0):
    return hf_models.build(name, "stridedfa", seed), hf_models.build(name, BASELINE.get(name, "sdpa"), seed)


def _assert_close(actual, expected, what, atol=2e-5):
    error = (actual - expected).abs().max().item()
    scale = expected.abs().max().item()
    assert error <= atol + 1e-4 * scale, f"{what}: max error {error:.3g} (reference scale {scale:.3g})"


# --- Registration ---------------------------------------------------------------------------------

def test_import_registers_the_attention_and_the_mask_function():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert AttentionInterface._global_mapping["stridedfa"] is sft.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["stridedfa"] is stridedfa_mask


def test_set_attn_implementation_switches_a_built_model():
    model = hf_models.build("llama", "sdpa")
    model.set_attn_implementation("stridedfa")
    assert model.config._attn_implementation == "stridedfa"


@pytest.mark.parametrize("name,padding", [("llama", "left"), ("gemma2", "right"), ("gemma2", "none"),
                                          ("gpt_oss", "left"), ("bert", "right")])
def test_cpu_tensors_fall_back_with_one_warning_naming_the_reason(name, padding):
    """Falling back runs transformers' SDPA, or the model's eager attention where SDPA lacks an
    option (Gemma 2's softcap, gpt-oss's sinks), with the mask rebuilt from stridedfa's."""
    if name not in FAMILIES:
        pytest.skip(f"{name} is not in this transformers")
    sft._warned.clear()
    ours, baseline = _pair(name)
    ids, mask = hf_models.batch(hf_models.FAMILIES[name][1], padding)
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = ours(ids, attention_mask=mask).logits
    messages = [str(w.message) for w in caught if "stridedfa" in str(w.message)]
    assert len(messages) == 1 and "tensors on cpu" in messages[0], messages
    _assert_close(logits[real], baseline(ids, attention_mask=mask).logits[real], f"{name} fallback logits")


def test_fallback_can_raise_instead():
    ours = hf_models.build("llama", "stridedfa")
    ids, _ = hf_models.batch("causal", "none")
    sft.set_fallback("raise")
    try:
        with pytest.raises(sft.UnsupportedError, match="tensors on cpu"):
            ours(ids)
    finally:
        sft.set_fallback("warn")
    with pytest.raises(ValueError, match="'warn' or 'raise'"):
        sft.set_fallback("ignore")


# --- The mask function ----------------------------------------------------------------------------

def _mask(attention_mask=None, q_length=6, kv_length=6, **kwargs):
    args = dict(batch_size=2 if attention_mask is None else attention_mask.shape[0], q_length=q_length,
                kv_length=kv_length, attention_mask=None if attention_mask is None else attention_mask.bool())
    return stridedfa_mask(**{**args, **kwargs})


def test_no_padding_is_expressed_by_the_options_alone(padding_check):
    mask = _mask(torch.ones(2, 6))
    assert isinstance(mask, StridedMask) and (mask.kind, mask.causal, mask.window) == ("full", True, None)
    assert _mask(mask_function=mu.bidirectional_mask_function).causal is False


def test_windows_are_read_from_the_mask_function():
    assert _mask(mask_function=mu.sliding_window_causal_mask_function(7)).window == (6, 0)
    assert _mask(mask_function=mu.sliding_window_bidirectional_mask_function(4)).window == (4, 4)


def test_right_padding_becomes_the_keys_lengths(padding_check):
    """The keys' lengths alone: padded query rows see every real key, as under transformers' SDPA
    (issue 30: their outputs feed the loss as SDPA's do)."""
    mask = _mask(torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]))
    assert mask.kind == "lengths"
    assert mask.seqlens_q is None and mask.seqlens_kv.tolist() == [6, 3]
    assert mask.seqlens_kv.dtype == torch.int32 and mask.rows_seen is None


def test_left_padding_becomes_three_sequences_per_row(padding_check):
    """The query rows before a row's first real key see none under SDPA: rows_seen zeroes them."""
    mask = _mask(torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]]))
    assert mask.kind == "runs"
    assert mask.cu_seqlens_q.tolist() == [0, 0, 6, 6, 8, 12, 12] == mask.cu_seqlens_kv.tolist()
    assert (mask.max_seqlen_q, mask.max_seqlen_kv) == (6, 6)
    assert mask.rows_seen.tolist() == [[True] * 6, [False, False, True, True, True, True]]


def test_decoding_with_left_padding_pairs_the_new_query_with_its_row_keys(padding_check):
    padding = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]])
    mask = _mask(padding, q_length=1, kv_length=7, q_offset=6)
    assert mask.kind == "runs"
    assert mask.cu_seqlens_q.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert mask.cu_seqlens_kv.tolist() == [0, 0, 7, 7, 10, 14, 14]


def test_a_static_cache_gets_the_dense_mask():
    # keys past the last query (empty slots); generate() hands the mask back to transformers,
    # which passes only a 4D tensor through
    for offset in (4, torch.tensor(4)):
        mask = _mask(torch.ones(2, 6), q_length=2, kv_length=16, q_offset=offset)
        assert isinstance(mask, torch.Tensor) and mask.shape == (2, 1, 2, 16)


def test_holes_get_transformers_dense_mask(padding_check):
    padding = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    mask = _mask(padding)
    assert isinstance(mask, torch.Tensor) and mask.shape == (2, 1, 6, 6)
    assert torch.equal(mask, mu.sdpa_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=padding.bool(),
                                          allow_is_causal_skip=False))


def test_unknown_mask_functions_and_edited_masks_get_the_dense_mask():
    chunked = mu.chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long))
    assert isinstance(_mask(mask_function=chunked), torch.Tensor)
    assert isinstance(_mask(allow_is_causal_skip=False), torch.Tensor)


def test_packed_documents_become_one_sequence_each():
    documents = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    base = mu.causal_mask_function
    if hasattr(mu, "remap_positions_for_packed_sequence"):  # transformers >= 5.2x
        base = mu.remap_positions_for_packed_sequence(base, positions)
    function = mu.and_masks(base, mu.packed_sequence_mask_function(documents))
    mask = stridedfa_mask(batch_size=1, q_length=9, kv_length=9, mask_function=function)
    assert mask.kind == "packed" and mask.causal
    assert mask.cu_seqlens_q.tolist() == [0, 3, 5, 9] and mask.max_seqlen_q == 4


def test_the_dense_form_is_transformers_mask_for_every_kind(padding_check):
    padding = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mask = _mask(padding)
    expected = mu.sdpa_mask(batch_size=2, q_length=6, kv_length=6, attention_mask=padding.bool(),
                            allow_is_causal_skip=False)
    assert torch.equal(mask.dense(), expected)
    bias = mask.bias(torch.float16)
    assert bias.dtype == torch.float16 and torch.equal(bias == 0, expected)
    assert torch.isfinite(bias).all(), "masked scores are the lowest finite value, never -inf"


# --- Whole models ---------------------------------------------------------------------------------

@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("padding", ["none", "right", "left"])
@pytest.mark.parametrize("name", FAMILIES)
def test_models_match_transformers_forward_and_backward(kernels, name, padding, check, monkeypatch):
    _set_padding_check(monkeypatch, check)
    _model_matches_transformers(kernels, name, padding)
    # The default reads no padding on the host: the keys' padding is a bias beside the options.
    expected_path = {"none": "dense", "right": "lengths" if check else "masked",
                     "left": "varlen" if check else "masked"}[padding]
    if check and padding == "left" and name in LEFT_PADDED_TRAINING_BIAS:
        expected_path = "bias"
    assert set(kernels.paths) == {expected_path}, kernels.paths


def _model_matches_transformers(kernels, name, padding):
    kind = hf_models.FAMILIES[name][1]
    ours, baseline = _pair(name)
    ids, mask = hf_models.batch(kind, padding)
    # Against SDPA every row counts, padded ones too (issue 30: a loss term reads the padded row
    # before a left-padded row's first token); eager's padded rows average the values instead.
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None or name not in BASELINE else mask.bool()
    training = {"use_cache": False} if kind == "causal" else {}  # a cache would hold k and v head-major
    results = []
    for model in (ours, baseline):
        model.zero_grad()
        logits = model(ids, attention_mask=mask, **training).logits
        loss = (logits.float().log_softmax(-1)[..., 0] * real).sum()
        loss.backward()
        results.append((logits[real], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    _assert_close(results[0][0], results[1][0], f"{name} logits ({padding} padding)")
    assert results[0][1].keys() == results[1][1].keys()
    for parameter, grad in results[0][1].items():
        _assert_close(grad, results[1][1][parameter], f"{name} grad of {parameter} ({padding} padding)", atol=1e-4)


@pytest.mark.parametrize("name", DECODERS)
def test_packed_documents_match_transformers(kernels, name):
    ours, baseline = _pair(name)
    ids, positions = hf_models.packed()
    # transformers looks for packed documents only without a cache, i.e. in training
    expected = baseline(ids, position_ids=positions, use_cache=False).logits
    _assert_close(ours(ids, position_ids=positions, use_cache=False).logits, expected, f"{name} packed logits")
    assert set(kernels.paths) == ({"dense"} if name in NO_PACKING else {"varlen"}), kernels.paths


@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generation_matches_transformers(kernels, name, cache, padding):
    ours, baseline = _pair(name)
    ids, mask = hf_models.batch("causal", padding, s=12)
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation=cache)
    tokens = ours.generate(ids, attention_mask=mask, **settings)
    assert torch.equal(tokens, baseline.generate(ids, attention_mask=mask, **settings))
    if cache == "dynamic" and padding == "none":
        # Left padding with a cache is a bias (the cache holds k and v head-major, which no token
        # axis can describe), as is a static cache's decoding step (transformers asks for the
        # real mask there); everything else runs on the options.
        assert "bias" not in kernels.paths, kernels.paths


def test_output_attentions_falls_back_by_name(kernels, monkeypatch):
    monkeypatch.setitem(sft._settings, "fallback", "warn")
    sft._warned.clear()
    ours, baseline = _pair("llama")
    ids, _ = hf_models.batch("causal", "none")
    with pytest.warns(UserWarning, match="output_attentions"):
        ours(ids, output_attentions=True)


def test_flattening_collators_cu_seq_lens_are_used_as_given(kernels):
    """DataCollatorWithFlattening hands cu_seq_lens_q/k and max_length_q/k with the position_ids:
    they cut the row as given (transformers' flash path does the same)."""
    ours, baseline = _pair("llama")
    ids, positions = hf_models.packed(lengths=(5, 9, 4, 6))
    cu = torch.tensor([0, 5, 14, 18, 24], dtype=torch.int32)
    expected = baseline(ids, position_ids=positions, use_cache=False).logits
    got = ours(ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=9,
               max_length_k=9).logits
    _assert_close(got, expected, "llama logits with cu_seq_lens")
    assert set(kernels.paths) == {"varlen"}, kernels.paths


# --- Never reading the padding on the host (the default) -----------------------------------------

def test_unchecked_padding_is_the_keys_bias_and_each_rows_end():
    padding = torch.tensor([[0, 1, 1, 0, 1, 1], [1, 1, 1, 0, 0, 0]])
    mask = _mask(padding)
    assert mask.kind == "masked" and mask.seqlens_q is None  # padded query rows computed, as SDPA does
    assert mask.seqlens_kv.tolist() == [6, 3]
    assert mask.rows_seen.tolist() == [[False] + [True] * 5, [True] * 6]  # row 0 sees no key
    bias = mask.bias(torch.bfloat16)
    assert bias.shape == (2, 1, 1, 6) and torch.equal(bias[:, 0, 0] == 0, padding.bool())
    decoding = _mask(torch.ones(2, 7), q_length=1, kv_length=7, q_offset=6)
    assert decoding.kind == "masked" and decoding.seqlens_kv is None, "with a cache: the batch's diagonal"


def test_a_decoding_step_without_padding_runs_on_the_options_alone():
    """Generation (no autograd) asks whether a decoding step's mask has padding, as SDPA's path does:
    an all-ones mask needs no bias (and keeps decoding by heads' graphs); real padding keeps it."""
    with torch.no_grad():
        assert _mask(torch.ones(2, 7), q_length=1, kv_length=7, q_offset=6).kind == "full"
        padded = torch.ones(2, 7)
        padded[1, :2] = 0
        assert _mask(padded, q_length=1, kv_length=7, q_offset=6).kind == "masked"
    assert _mask(torch.ones(2, 7), q_length=1, kv_length=7, q_offset=6).kind == "masked"  # autograd: no read


def test_unchecked_padding_finds_the_rows_a_window_leaves_without_keys():
    """A row whose window holds padding alone sees no key (0 under SDPA): rows_seen says so."""
    from stridedfa._hf_masks import _rows_seen

    keep = torch.tensor([[0, 0, 0, 0, 1, 1, 0, 0, 0, 1]], dtype=torch.bool)
    bidirectional = _rows_seen(keep, causal=False, window=(1, 1))  # keys i-1 .. i+1
    assert bidirectional.tolist() == [[False, False, False, True, True, True, True, False, True, True]]
    causal = _rows_seen(keep, causal=True, window=(2, 0))  # keys i-2 .. i
    assert causal.tolist() == [[False, False, False, False, True, True, True, True, False, True]]
    assert _rows_seen(keep, causal=True, window=None).tolist() == [[False] * 4 + [True] * 6]
    assert _rows_seen(keep, causal=False, window=None) is None


def test_unchecked_padding_reads_nothing_on_the_host():
    """On the meta device any host read of the mask's values raises: the mask is built anyway."""
    padding = torch.ones(3, 16, dtype=torch.bool, device="meta")
    mask = stridedfa_mask(batch_size=3, q_length=16, kv_length=16, attention_mask=padding, device="meta")
    assert mask.kind == "masked" and mask.seqlens_kv.device.type == "meta" and mask.rows_seen.device.type == "meta"
    assert mask.bias(torch.float16).shape == (3, 1, 1, 16)


@pytest.mark.parametrize("padding", ["none", "right", "left", "holes"])
@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss", "bert", "modernbert"])
def test_unchecked_padding_matches_transformers(kernels, name, padding):
    if name not in FAMILIES:
        pytest.skip(f"{name} is not in this transformers")
    kind = hf_models.FAMILIES[name][1]
    ours, baseline = _pair(name)
    ids, mask = hf_models.batch(kind, "right" if padding == "holes" else padding)
    if padding == "holes":
        mask[:, 3] = 0  # a hole in every row
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    training = {"use_cache": False} if kind == "causal" else {}
    results = []
    for model in (ours, baseline):
        logits = model(ids, attention_mask=mask, **training).logits
        (logits.float().log_softmax(-1)[..., 0] * real).sum().backward()
        results.append((logits[real], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    _assert_close(results[0][0], results[1][0], f"{name} logits ({padding})")
    for parameter, grad in results[0][1].items():
        _assert_close(grad, results[1][1][parameter], f"{name} grad of {parameter} ({padding})", atol=1e-4)
    assert set(kernels.paths) == ({"dense"} if padding == "none" else {"masked"}), kernels.paths


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_unchecked_padding_generation_matches_transformers(kernels, name):
    ours, baseline = _pair(name)
    ids, mask = hf_models.batch("causal", "left", s=12)
    settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, attention_mask=mask, **settings),
                       baseline.generate(ids, attention_mask=mask, **settings))
    assert "varlen" not in kernels.paths and "lengths" not in kernels.paths, kernels.paths


@pytest.mark.parametrize("check", [True, False])
def test_a_padded_forward_compiles_whole_with_torch_compile(kernels, check, monkeypatch):
    """torch.compile(fullgraph=True) traces the mask and attention functions without a graph break:
    with the padding check on, traced code takes transformers' 4D mask as a bias; off, the keys'
    padding ("masked") -- either way transformers' logits."""
    _set_padding_check(monkeypatch, check)
    ours, baseline = _pair("llama")
    ids, mask = hf_models.batch("causal", "left")
    compiled = torch.compile(ours, backend="eager", fullgraph=True)
    logits = compiled(ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    _assert_close(logits[real], baseline(ids, attention_mask=mask, use_cache=False).logits[real], "compiled logits")
    assert set(kernels.paths) == ({"bias"} if check else {"masked"}), kernels.paths


def test_attention_dropout_is_handed_over_in_training_only(kernels):
    model = hf_models.build("llama", "stridedfa")
    model.config.attention_dropout = 0.25
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.25
    ids, mask = hf_models.batch("causal", "right")
    model.train()
    model(ids, attention_mask=mask, use_cache=False)
    assert kernels.dropout and set(kernels.dropout) == {0.25}
    kernels.dropout.clear()
    model.eval()
    model(ids, attention_mask=mask, use_cache=False)
    assert set(kernels.dropout) == {0.0}


def test_fallback_after_a_cache_keeps_the_causal_diagonal_bottom_right():
    """A chunk of queries after a cache, falling back (CPU tensors): transformers' own mask is
    handed to SDPA, whose is_causal shortcut would align the chunk top-left."""
    sft._warned.clear()
    ours, baseline = _pair("llama")
    ids, _ = hf_models.batch("causal", "none", b=2, s=20)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model in (ours, baseline):
            first = model(ids[:, :12], use_cache=True)
            results.append(model(ids[:, 12:], past_key_values=first.past_key_values, use_cache=True).logits)
    _assert_close(results[0], results[1], "logits of the second chunk")


def _t5(attn_implementation):
    from transformers import AutoModelForSeq2SeqLM, T5Config

    config = T5Config(vocab_size=hf_models.VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0,
                      dropout_rate=0.0)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attn_implementation)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval()


def test_t5_position_bias_and_its_gradient_match_transformers(kernels):
    """T5's learned relative position bias (encoder, decoder, cross-attention over a padded
    encoder input): folded with the mask into one bias, with its gradient; greedy generation."""
    ours, baseline = _t5("stridedfa"), _t5("sdpa")
    ids, mask = hf_models.batch("encoder", "right", b=3, s=16)
    labels, _ = hf_models.batch("causal", "none", b=3, s=9, seed=1)
    results = []
    for model in (ours, baseline):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.logits, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    _assert_close(results[0][0], results[1][0], "t5 logits")
    assert results[0][1].keys() == results[1][1].keys()
    bias_grads = [n for n in results[0][1] if "relative_attention_bias" in n]
    assert bias_grads, "the position bias is learned: it gets a gradient"
    for parameter, grad in results[0][1].items():
        _assert_close(grad, results[1][1][parameter], f"t5 grad of {parameter}", atol=1e-4)
    assert set(kernels.paths) == {"bias"}, kernels.paths
    settings = dict(max_new_tokens=5, do_sample=False)
    assert torch.equal(ours.generate(ids, attention_mask=mask, **settings),
                       baseline.generate(ids, attention_mask=mask, **settings))


# --- Found in review: cross-attention, arguments no path honours, masks models extend ----------

@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_cross_attention_keeps_every_decoder_query(kernels, padding, check, monkeypatch):
    """BART's cross-attention with as many decoder tokens as encoder tokens: the padding mask is
    the encoder's (the keys'), never the decoder queries'."""
    from transformers import AutoModelForSeq2SeqLM, BartConfig

    config = BartConfig(vocab_size=hf_models.VOCAB, d_model=64, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        max_position_embeddings=64)
    ids, mask = hf_models.batch("encoder", padding, b=2, s=8)
    decoder_ids, _ = hf_models.batch("causal", "none", b=2, s=8, seed=1)
    logits = []
    _set_padding_check(monkeypatch, check)
    for implementation in ("stridedfa", "sdpa"):
        torch.manual_seed(0)
        model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=implementation).eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0, 0.3)
            logits.append(model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                                use_cache=False).logits)
    _assert_close(logits[0], logits[1], f"bart logits ({padding} padding, check {check})")


def _module(causal):
    module = torch.nn.Module()
    module.is_causal = causal
    return module


def test_the_mask_decides_the_window_not_a_sliding_window_argument(kernels):
    """A layer may pass sliding_window= with a windowless mask (DiffusionGemma): SDPA and eager
    follow the mask, and so does stridedfa."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 10, 16, generator=gen) for _ in range(3))
    for function, causal in ((mu.bidirectional_mask_function, False), (mu.causal_mask_function, True)):
        mask = stridedfa_mask(batch_size=1, q_length=10, kv_length=10, mask_function=function)
        with_argument, _ = sft.attention_forward(_module(causal), q, k, v, mask, scaling=0.25, sliding_window=4)
        without, _ = sft.attention_forward(_module(causal), q, k, v, mask, scaling=0.25)
        assert torch.equal(with_argument, without)


@pytest.mark.parametrize("argument", ["indices", "block_indices", "sinks"])
def test_arguments_no_path_honours_are_refused_by_name(kernels, argument):
    q = torch.randn(1, 2, 6, 16)
    with pytest.raises(sft.UnsupportedError, match=argument):
        sft.attention_forward(_module(True), q, q, q, None, **{argument: torch.zeros(1, 6, 2, dtype=torch.long)})


def test_keys_beyond_the_mask_are_refused(kernels):
    """DeepSeek-V4 appends compressed keys and extends the mask only when it is a tensor."""
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 9, 16)
    mask = stridedfa_mask(batch_size=1, q_length=6, kv_length=6)
    with pytest.raises(sft.UnsupportedError, match="9 keys but its mask describes 6"):
        sft.attention_forward(_module(True), q, k, k, mask)


def test_a_strided_mask_indexes_as_transformers_mask():
    padding = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mask = _mask(padding)
    assert torch.equal(mask[:, 0, :, :], mask.dense()[:, 0, :, :])


def test_a_float32_mask_stays_finite_in_half_precision():
    from stridedfa._hf_masks import bias_from_mask

    low = torch.full((1, 1, 2, 3), torch.finfo(torch.float32).min)
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.isfinite(bias_from_mask(low, dtype)).all()


def test_a_bidirectional_window_over_padding_on_both_sides_gets_the_dense_mask(padding_check):
    """Bidirectional runs put each sequence's diagonal at its run's end: right only when the run
    ends the row (left padding); with padding on both sides a window would move."""
    window = mu.sliding_window_bidirectional_mask_function(2)
    both = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert isinstance(_mask(both, mask_function=window), torch.Tensor)
    left = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    assert _mask(left, mask_function=window).kind == "runs"


# --- Issue 30: what the integration did, said; the fallback keeps the window; the mask's dtype ------

def test_stats_count_calls_served_and_fallbacks_by_reason(kernels, padding_check):
    """A float32 model (the README's old example) falls back on every call: the counters say so, per
    reason, and so does cache_info(); a bfloat16 model is served."""
    import stridedfa

    sft._warned.clear()
    sft.reset_stats()
    ids, mask = hf_models.batch("causal", "right")
    reason = "torch.float32: cuDNN's fused attention takes float16 or bfloat16"
    with warnings.catch_warnings():  # the reference stands in for cuDNN (kernels); the dtype decides
        warnings.simplefilter("ignore")
        real_check = sft.__dict__["_cannot_run"]
        sft._cannot_run = lambda query, kwargs: None if query.dtype == torch.bfloat16 else reason
        try:
            with sft.fallback("warn"):
                hf_models.build("llama", "stridedfa")(ids, attention_mask=mask)
            counted = sft.stats()
            assert counted["served"] == 0 and counted["fallbacks"] == 2, counted  # two layers
            assert counted["fallback_reasons"] == {reason: 2}
            assert stridedfa.cache_info()["transformers"] == counted
            hf_models.build("llama", "stridedfa", dtype=torch.bfloat16)(ids, attention_mask=mask)
            counted = sft.stats()
            assert counted["served"] == 2 and counted["served_by_path"] == {"lengths": 2}, counted
        finally:
            sft._cannot_run = real_check
    sft.reset_stats()
    assert sft.stats() == {"served": 0, "served_by_path": {}, "fallbacks": 0, "fallback_reasons": {}}


def test_the_fallback_mode_can_be_scoped_to_a_block():
    ours = hf_models.build("llama", "stridedfa")
    ids, _ = hf_models.batch("causal", "none")
    assert sft._settings["fallback"] == "warn"
    with sft.fallback("raise"):
        with pytest.raises(sft.UnsupportedError, match="tensors on cpu"):
            ours(ids)
    sft._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours(ids)  # the global setting again
    assert any("tensors on cpu" in str(w.message) for w in caught)
    sft.set_fallback("raise")
    try:
        with sft.fallback("warn"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours(ids)
    finally:
        sft.set_fallback("warn")
    with pytest.raises(ValueError, match="'warn' or 'raise'"):
        with sft.fallback("ignore"):
            pass


def test_the_sdpa_fallback_keeps_the_sliding_window_without_a_mask():
    """transformers hands attention_mask=None for an unpadded batch; SDPA's is_causal alone would
    drop Mistral's window (the fallback builds the pattern's mask)."""
    if "mistral" not in FAMILIES:
        pytest.skip("mistral is not in this transformers")
    sft._warned.clear()
    ours, baseline = _pair("mistral")
    ids, _ = hf_models.batch("causal", "none", s=20)  # longer than the window of 7
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ours(ids).logits
    _assert_close(got, baseline(ids).logits, "mistral fallback logits")
    module = ours.model.layers[0].self_attn
    q = torch.randn(1, 4, 10, 32)
    kv = torch.randn(1, 2, 10, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = sft.attention_forward(module, q, kv, kv, None, scaling=1.0, sliding_window=3, is_causal=True)
    mask = torch.ones(10, 10, dtype=torch.bool).tril() & ~torch.ones(10, 10, dtype=torch.bool).tril(-3)
    want = torch.nn.functional.scaled_dot_product_attention(q, kv.repeat_interleave(2, 1), kv.repeat_interleave(2, 1),
                                                            attn_mask=mask, scale=1.0)
    _assert_close(out, want.transpose(1, 2), "windowed fallback")


def test_a_strided_mask_answers_dtype_device_and_to_like_transformers_mask():
    mask = _mask(torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]))
    assert isinstance(mask, StridedMask)
    assert mask.dtype == torch.bool and mask.device == torch.device("cpu")
    assert mask.to("cpu") is mask and mask.to(torch.bool) is mask and mask.to(device="cpu", dtype=torch.bool) is mask
    as_float = mask.to(torch.float32)
    assert as_float.dtype == torch.float32 and torch.equal(as_float.bool(), mask.dense())
    assert _mask().dtype == torch.bool and _mask().device == torch.device("cpu")


def test_continuous_batching_still_admits_no_custom_attention():
    """Issue 30 asked for "paged|stridedfa" under transformers' continuous batching. transformers
    >= 5.23 strips the "paged|" prefix from every name but "paged|eager", and its continuous batching
    runs only "paged|eager", "sdpa" or a name containing "flash" (which it loads as a flash kernel):
    a registered implementation is refused by name. This pins that gate: when a transformers
    release admits custom implementations, this fails, and the paged integration can be built."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) < Version("5.23"):
        pytest.skip("before 5.23 continuous batching ran 'paged|<name>' implementations (not served here)")
    model = hf_models.build("llama", "stridedfa")
    with pytest.raises(ValueError, match="not supported for continuous batching"):
        model.init_continuous_batching()
    with pytest.warns(FutureWarning, match="paged"):
        paged = hf_models.build("llama", "paged|stridedfa")
    assert paged.config._attn_implementation == "stridedfa", transformers.__version__
