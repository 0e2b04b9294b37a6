"""The additive score bias on the CPU (no GPU): which shapes and strides validation accepts (NumPy
broadcasting to (b, h_q, s_q, s_kv)), how grad_bias must look, and what cuDNN is told (read from
the graph key: shared seq axes as stride 0, bottom-right bands as shifted top-left bands)."""

from __future__ import annotations

import itertools

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

B, H, D, S_Q, S_KV = 2, 4, 64, 32, 48
SLOTS = {row["name"]: row["slot"] for row in _core._operands()}
_addresses = itertools.count(1)


def t(shape, dtype="bfloat16", strides=None):
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_addresses) * (1 << 30))


def forward(s_q=S_Q, s_kv=S_KV, **options):
    return dict(q=t((B, H, s_q, D)), k=t((B, H, s_kv, D)), v=t((B, H, s_kv, D)), out=t((B, H, s_q, D)),
                **options)


def backward(s_q=S_Q, s_kv=S_KV, **options):
    q, k, v = t((B, H, s_q, D)), t((B, H, s_kv, D)), t((B, H, s_kv, D))
    return dict(q=q, k=k, v=v, out=t(q.shape), grad_out=t(q.shape), lse=t((B, H, s_q), "float32"),
                grad_q=t(q.shape), grad_k=t(k.shape), grad_v=t(v.shape), **options)


def key(s_q=S_Q, s_kv=S_KV, **options):
    return _core._forward_graph_key(**forward(s_q, s_kv), **options, cudnn_version=92600)


def described(graph_key, name):
    """(dims, strides) of one operand as the key gives it to cuDNN: op and dtype, then per slot a
    present flag followed, when present, by 4 dims and 4 strides."""
    i = 2
    for slot in range(len(SLOTS)):
        present = graph_key[i]
        if slot == SLOTS[name]:
            assert present, name
            return tuple(graph_key[i + 1:i + 5]), tuple(graph_key[i + 5:i + 9])
        i += 9 if present else 1
    raise AssertionError(name)


def mask_options(graph_key):
    """(causal, alignment, left bound, right bound) as cuDNN is given them (after the operands and
    the scale's bits)."""
    i = 2
    for _ in range(len(SLOTS)):
        i += 9 if graph_key[i] else 1
    return tuple(graph_key[i + 1:i + 5])


@pytest.mark.parametrize("shape", [(B, H, S_Q, S_KV), (1, H, S_Q, S_KV), (B, 1, S_Q, S_KV), (1, 1, S_Q, S_KV),
                                   (H, S_Q, S_KV), (S_Q, S_KV)],
                         ids=lambda s: "x".join(map(str, s)))
def test_biases_shared_over_batch_and_heads_are_accepted(shape):
    problem = _core._validate_forward(**forward(), bias=t(shape))
    assert problem["s_kv"] == S_KV
    _core._validate_backward(**backward(), bias=t(shape), grad_bias=t(shape))


@pytest.mark.parametrize("shape, strides", [((B, 1, 1, S_KV), None), ((S_KV,), None),
                                            ((B, H, S_Q, S_KV), (S_KV, 0, 0, 1))],  # (b, 1, 1, s_kv) expanded
                         ids=["key_mask", "1d", "expanded_over_rows"])
def test_biases_shared_over_query_rows_are_read_but_not_differentiated(shape, strides):
    # a key-padding mask as a bias needs no copy; its gradient cuDNN 9.19 gets wrong (GPU run 30)
    _core._validate_forward(**forward(), bias=t(shape, strides=strides))
    _core._validate_backward(**backward(), bias=t(shape, strides=strides))
    if shape[-2:-1] != (S_Q,):  # its own rows are shared: the gradient would sum over them
        with pytest.raises(stridedfa.UnsupportedError, match=r"^grad_bias: the gradient of a bias shared over query"):
            _core._validate_backward(**backward(), bias=t(shape, strides=strides), grad_bias=t(shape))
    dims, bias_strides = described(key(bias=t(shape, strides=strides)), "bias")
    assert dims[2:] == (S_Q, S_KV) and bias_strides[2:] == (0, 1)  # rows shared: stride 0


def test_a_bias_constant_along_rows_is_refused():
    with pytest.raises(stridedfa.UnsupportedError, match=r"^bias: axis 3 \(seq of k\) is shared"):
        _core._validate_forward(**forward(), bias=t((B, H, S_Q, 1)))


@pytest.mark.parametrize("shape, message", [
    ((B, H, S_Q, S_KV + 8), r"^bias: shape .* not broadcastable .*axis 3 \(seq of k\) is 56, expected 48 or 1"),
    ((3, H, S_Q, S_KV), r"^bias: .*axis 0 \(batch\) is 3, expected 2 or 1"),
    ((S_Q + 1, S_KV), r"^bias: .*axis 0 \(seq of q\) is 33, expected 32 or 1"),
    ((1, B, H, S_Q, S_KV), r"^bias: expected up to 4 axes"),
])
def test_biases_of_other_shapes_are_refused_naming_the_axis(shape, message):
    with pytest.raises(stridedfa.LayoutError, match=message):
        _core._validate_forward(**forward(), bias=t(shape))


def test_a_bias_has_the_attention_dtype():
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: dtype float32 .*attention dtype"):
        _core._validate_forward(**forward(), bias=t((S_Q, S_KV), "float32"))
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: dtype float16 differs from q's bfloat16"):
        _core._validate_forward(**forward(), bias=t((S_Q, S_KV), "float16"))


def test_bias_strides_batch_and_heads_may_be_zero_the_key_axis_must_be_contiguous():
    _core._validate_forward(**forward(), bias=t((B, H, S_Q, S_KV), strides=(S_Q * S_KV, 0, S_KV, 1)))
    _core._validate_forward(**forward(), bias=t((B, H, S_Q, S_KV), strides=(S_KV, 0, 0, 1)))
    sliced = t((B, H, S_Q, S_KV), strides=(H * S_Q * 64, S_Q * 64, 64, 1))  # rows of a wider buffer
    _core._validate_forward(**forward(), bias=sliced)
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: axis 1 \(seq of k\) has stride 2; .*contiguous"):
        _core._validate_forward(**forward(), bias=t((S_Q, S_KV), strides=(2 * S_KV, 2)))
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: axis 0 \(seq of q\) has negative stride"):
        _core._validate_forward(**forward(), bias=t((S_Q, S_KV), strides=(-S_KV, 1)))
    off = FakeTensor((S_Q, S_KV), None, "bfloat16", data=0x100000000000 + next(_addresses) * (1 << 30) + 2)
    with pytest.raises(stridedfa.LayoutError, match=r"^bias: data pointer .* 2 bytes past a 16-byte boundary"):
        _core._validate_forward(**forward(), bias=off)


def test_grad_bias_has_bias_shape_and_its_own_memory():
    bias = t((1, H, S_Q, S_KV))
    with pytest.raises(stridedfa.LayoutError, match=r"^grad_bias: shape \(2, 4, 32, 48\) is not bias' shape"):
        _core._validate_backward(**backward(), bias=bias, grad_bias=t((B, H, S_Q, S_KV)))
    with pytest.raises(stridedfa.LayoutError, match=r"^grad_bias: axis 1 \(heads\) has stride 0"):
        _core._validate_backward(**backward(), bias=bias,
                                 grad_bias=t((1, H, S_Q, S_KV), strides=(H * S_Q * S_KV, 0, S_KV, 1)))
    with pytest.raises(stridedfa.LayoutError, match=r"^grad_bias is given without bias"):
        _core._validate_backward(**backward(), grad_bias=bias)
    with pytest.raises(stridedfa.LayoutError, match=r"^grad_bias .*overlaps bias|^grad_bias overlaps"):
        _core._validate_backward(**backward(), bias=bias, grad_bias=bias)


def test_the_bias_is_part_of_the_graph_key_with_shared_axes_as_cudnn_broadcasts_them():
    assert key(bias=t((B, H, S_Q, S_KV))) != key()
    assert key(bias=t((B, H, S_Q, S_KV))) != key(bias=t((1, H, S_Q, S_KV)))
    dims, strides = described(key(bias=t((S_Q, S_KV))), "bias")
    assert dims == (1, 1, S_Q, S_KV) and strides[2:] == (S_KV, 1)


def test_with_a_bias_bottom_right_bands_reach_cudnn_as_shifted_top_left_bands():
    causal, alignment, left, right = mask_options(key(causal=True, causal_alignment="bottom_right",
                                                      bias=t((S_Q, S_KV))))
    assert (causal, alignment, left, right) == (1, 0, -1, S_KV - S_Q)  # top-left, right bound s_kv - s_q
    _, alignment, left, right = mask_options(key(window=(20, 0), causal_alignment="bottom_right",
                                                 bias=t((S_Q, S_KV))))
    assert (alignment, left, right) == (0, 20 - (S_KV - S_Q), S_KV - S_Q)
    # without a bias the alignment stays as given
    assert mask_options(key(causal=True, causal_alignment="bottom_right"))[1] == 1
    # keys no row sees are cut first (here keys 0-7), so the shifted band starts at the diagonal
    _, alignment, left, right = mask_options(key(window=(8, 0), causal_alignment="bottom_right",
                                                 bias=t((S_Q, S_KV))))
    assert (alignment, left, right) == (0, 0, 8)
    # a cut at key 12 would start the bias 24 bytes in: off a 16-byte boundary, refused by name
    with pytest.raises(stridedfa.UnsupportedError, match="^bias: the mask leaves rows or keys out .*16-byte"):
        key(window=(4, 0), causal_alignment="bottom_right", bias=t((S_Q, S_KV)))
    # with padding lengths the diagonal moves per sequence: no static band says it
    lengths = dict(seqlens_q=t((B,), "int32"), seqlens_kv=t((B,), "int32"))
    with pytest.raises(stridedfa.UnsupportedError, match="padding lengths"):
        key(causal=True, causal_alignment="bottom_right", bias=t((S_Q, S_KV)), **lengths)


def test_a_bias_cut_with_the_rows_and_keys_no_row_sees():
    # top-left causal with s_kv > s_q: keys past the last row are cut, the bias' key axis with them
    dims, _ = described(key(s_q=32, s_kv=512, causal=True, bias=t((32, 512))), "bias")
    assert dims == (1, 1, 32, 32)
    # ...but not when its gradient is asked for: cuDNN writes dbias packed only
    graph_key = _core._backward_graph_key(**backward(32, 512, causal=True), bias=t((32, 512)),
                                          grad_bias=t((32, 512)), cudnn_version=92600)
    assert described(graph_key, "grad_bias")[0] == (1, 1, 32, 512)


# --- ALiBi -------------------------------------------------------------------------------------


def alibi_terms(graph_key):
    """(alibi offset, per sequence) as cuDNN's score modifier is given them: after the mask
    options, the deterministic flag and the softcap's bits."""
    i = 2
    for _ in range(len(SLOTS)):
        i += 9 if graph_key[i] else 1
    return tuple(graph_key[i + 7:i + 9])


def test_alibi_slopes_are_float32_per_query_head():
    _core._validate_forward(**forward(), alibi_slopes=t((H,), "float32"))
    with pytest.raises(stridedfa.LayoutError, match=r"^alibi_slopes: expected shape \(heads of q,\)"):
        _core._validate_forward(**forward(), alibi_slopes=t((B, H), "float32"))
    with pytest.raises(stridedfa.LayoutError, match=r"^alibi_slopes: dtype bfloat16 .*float32"):
        _core._validate_forward(**forward(), alibi_slopes=t((H,), "bfloat16"))


@pytest.mark.parametrize("s_q, s_kv, options, expected", [
    (S_Q, S_KV, {}, (0, 0)),                                                      # top-left: i - j
    (S_Q, S_KV, {"causal_alignment": "bottom_right"}, (S_KV - S_Q, 0)),          # i + s_kv - s_q - j
    (32, 512, {"causal": True}, (0, 0)),                                          # keys past row 31 cut
    (256, 48, {"causal": True, "causal_alignment": "bottom_right"}, (0, 0)),      # 208 rows cut: i' = i - 208
    (S_Q, S_KV, {"window": (4, 0), "causal_alignment": "bottom_right"}, (4, 0)),  # 12 keys cut: j' = j - 12
])  # (ALiBi needs no aligned cut: its slopes are per head, not per key)
def test_alibi_distance_is_measured_in_the_indices_cudnn_sees(s_q, s_kv, options, expected):
    slopes = t((H,), "float32")
    graph_key = key(s_q, s_kv, alibi_slopes=slopes, **options)
    assert alibi_terms(graph_key) == expected
    assert graph_key != key(s_q, s_kv, **options)


def test_alibi_with_padding_bottom_right_is_refused_top_left_needs_no_offset():
    lengths = dict(seqlens_q=t((B,), "int32"), seqlens_kv=t((B,), "int32"))
    # cuDNN gave wrong numbers with the per-sequence offset (GPU run 30): refused until that is solved
    with pytest.raises(stridedfa.UnsupportedError, match="ALiBi with bottom-right alignment and padding"):
        key(alibi_slopes=t((H,), "float32"), causal_alignment="bottom_right", **lengths)
    assert alibi_terms(key(alibi_slopes=t((H,), "float32"), **lengths)) == (0, 0)  # top-left: no offset


# --- Found in review -----------------------------------------------------------------------------


def test_one_sided_padding_lengths_count_as_the_callers_for_bottom_right_bias_and_alibi():
    # only seqlens_kv given: the diagonal still moves per sequence (seqlens_kv[b] - s_q)
    kv_only = dict(seqlens_kv=t((B,), "int32"))
    with pytest.raises(stridedfa.UnsupportedError, match="padding lengths"):
        key(causal=True, causal_alignment="bottom_right", bias=t((S_Q, S_KV)), **kv_only)
    with pytest.raises(stridedfa.UnsupportedError, match="ALiBi with bottom-right alignment and padding"):
        key(causal_alignment="bottom_right", alibi_slopes=t((H,), "float32"), **kv_only)


def test_an_empty_problem_checks_the_gradients_it_zero_fills():
    # batch 0 with a bias shared by the batch: grad_bias has elements and is zero-filled, so it must be
    # a proper output -- its own memory, writable, aligned
    empty = backward()
    for name in ("q", "k", "v", "out", "grad_out", "grad_q", "grad_k", "grad_v"):
        empty[name] = t((0, *empty[name].shape[1:]))
    empty["lse"] = t((0, H, S_Q), "float32")
    bias = t((1, H, S_Q, S_KV))
    assert _core._validate_backward(**empty, bias=bias, grad_bias=t((1, H, S_Q, S_KV)))["nothing_to_do"]
    with pytest.raises(stridedfa.LayoutError, match="^grad_bias overlaps bias"):
        _core._validate_backward(**empty, bias=bias, grad_bias=bias)
    with pytest.raises(stridedfa.LayoutError, match=r"^grad_bias: axis 1 \(heads\) has stride 0"):
        _core._validate_backward(**empty, bias=bias, grad_bias=t((1, H, S_Q, S_KV), strides=(0, 0, S_KV, 1)))


def test_torch_refuses_a_bias_shared_over_rows_that_requires_grad_before_the_forward():
    torch = pytest.importorskip("torch")
    import stridedfa.torch as sfa_torch

    q = torch.zeros(B, H, S_Q, 64, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.zeros(B, H, S_KV, 64, dtype=torch.bfloat16)
    mask = torch.zeros(B, 1, 1, S_KV, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(stridedfa.UnsupportedError, match=rf"shared over query rows.*bias\.expand\(-1, -1, {S_Q}, -1\)"):
        sfa_torch.attention(q, kv, kv, bias=mask)


@pytest.mark.parametrize("option", [{"softcap": 30.0}, {"alibi": True}])
def test_torch_refuses_a_bias_gradient_the_backward_cannot_compute_before_the_forward(option):
    """Every rule of the core's backward is asked before a training forward: the bias' gradient
    under a score modifier is refused here on CPU tensors, which the forward itself would refuse
    for their device -- so the backward's verdict came first."""
    torch = pytest.importorskip("torch")
    import stridedfa.torch as sfa_torch

    q = torch.zeros(B, H, S_Q, 64, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.zeros(B, H, S_KV, 64, dtype=torch.bfloat16)
    bias = torch.zeros(B, H, S_Q, S_KV, dtype=torch.bfloat16, requires_grad=True)
    extra = {"alibi_slopes": torch.ones(H)} if option.pop("alibi", False) else option
    with pytest.raises(stridedfa.UnsupportedError, match="bias' gradient with (a softcap|ALiBi)"):
        sfa_torch.attention(q, kv, kv, bias=bias, **extra)
    packed = torch.zeros(B, S_Q, 3, H, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(stridedfa.UnsupportedError, match="bias' gradient with (a softcap|ALiBi)"):
        sfa_torch.packed_attention(packed, 2, bias=bias[:, :, :, :S_Q], **extra)
    with pytest.raises(stridedfa.LayoutError, match="CUDA device"):  # without the gradient: the forward's verdict
        sfa_torch.attention(q, kv, kv, bias=bias.detach(), **extra)


def test_the_pre_forward_check_refuses_nothing_the_backward_accepts_with_one_lengths_tensor():
    """One lengths tensor as both seqlens_q and seqlens_kv with s_q = s_kv: the core aligns a
    bottom-right mask top-left and accepts a bias and dropout there; the torch adapter's check of
    the backward must agree (here the forward then refuses the CPU tensors by their device)."""
    torch = pytest.importorskip("torch")
    import stridedfa.torch as sfa_torch

    q = torch.zeros(B, H, S_Q, 64, dtype=torch.bfloat16, requires_grad=True)
    lengths = torch.full((B,), S_Q, dtype=torch.int32)
    for extra in ({"dropout_p": 0.1}, {"bias": torch.zeros(B, H, S_Q, S_Q, dtype=torch.bfloat16, requires_grad=True)}):
        for same in (lengths, lengths[:], lengths.view(-1), lengths.detach()):  # one tensor, as the core tells it
            with pytest.raises(stridedfa.LayoutError, match="CUDA device"):
                sfa_torch.attention(q, q, q, causal=True, causal_alignment="bottom_right", seqlens_q=lengths,
                                    seqlens_kv=same, **extra)
        with pytest.raises(stridedfa.UnsupportedError):  # two tensors: refused before the forward, as the core would
            sfa_torch.attention(q, q, q, causal=True, causal_alignment="bottom_right", seqlens_q=lengths,
                                seqlens_kv=lengths.clone(), **extra)

