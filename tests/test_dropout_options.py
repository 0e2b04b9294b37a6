"""Dropout on the CPU (no GPU): the rng_state operand's rules, dropout_p's parse, what the graph key
holds, and what the core refuses by name before anything runs (read through the graph key, which
plans the call as a launch would)."""

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


def state(strides=None, shape=(2,), dtype="int64"):
    return t(shape, dtype, strides)


def forward(s_q=S_Q, s_kv=S_KV, **options):
    return dict(q=t((B, H, s_q, D)), k=t((B, H, s_kv, D)), v=t((B, H, s_kv, D)), out=t((B, H, s_q, D)),
                lse=t((B, H, s_q), "float32"), **options)


def backward(s_q=S_Q, s_kv=S_KV, **options):
    q, k, v = t((B, H, s_q, D)), t((B, H, s_kv, D)), t((B, H, s_kv, D))
    return dict(q=q, k=k, v=v, out=t(q.shape), grad_out=t(q.shape), lse=t((B, H, s_q), "float32"),
                grad_q=t(q.shape), grad_k=t(k.shape), grad_v=t(v.shape), **options)


def forward_key(**options):
    return _core._forward_graph_key(**forward(**options), cudnn_version=92600)


def backward_key(s_q=S_Q, s_kv=S_KV, **options):
    return _core._backward_graph_key(**backward(s_q, s_kv, **options), cudnn_version=92600)


def test_rng_state_is_read_at_any_stride_and_only_its_presence_is_keyed():
    a = forward_key(dropout_p=0.1, rng_state=state())
    assert forward_key(dropout_p=0.1, rng_state=state(strides=(3,))) == a
    assert forward_key(dropout_p=0.1, rng_state=state(strides=(-1,))) == a  # walked backwards: fine
    assert forward_key(dropout_p=0.2, rng_state=state()) != a
    assert forward_key() != a


def test_without_dropout_a_given_state_is_not_part_of_the_graph():
    assert forward_key(dropout_p=0.0, rng_state=state()) == forward_key()


@pytest.mark.parametrize("bad, message", [
    (dict(shape=(3,)), r"rng_state: expected shape \(2,\)"),
    (dict(shape=(1, 2)), r"rng_state: expected shape \(2,\)"),
    (dict(dtype="int32"), r"rng_state: dtype int32 .*int64"),
    (dict(dtype="float32"), r"rng_state: dtype float32 .*int64"),
])
def test_a_malformed_state_is_a_layout_error_naming_it(bad, message):
    with pytest.raises(stridedfa.LayoutError, match=message):
        _core._validate_forward(**forward(dropout_p=0.1, rng_state=state(**bad)))


def test_a_state_on_the_host_is_refused():
    host = FakeTensor((2,), None, "int64", data=0x200000, device=(1, 0))
    with pytest.raises(stridedfa.LayoutError, match="rng_state needs a CUDA device"):
        _core._validate_forward(**forward(dropout_p=0.1, rng_state=host))


def test_dropout_needs_a_state():
    with pytest.raises(stridedfa.LayoutError, match="dropout_p > 0 needs rng_state"):
        forward_key(dropout_p=0.1)
    with pytest.raises(stridedfa.LayoutError, match="dropout_p > 0 needs rng_state"):
        backward_key(dropout_p=0.1)


@pytest.mark.parametrize("p, error", [(1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError),
                                      (True, TypeError), (None, TypeError)])
def test_dropout_p_is_a_probability_below_one(p, error):
    with pytest.raises(error, match="dropout_p"):
        forward_key(dropout_p=p, rng_state=state())


@pytest.mark.parametrize("p", [1 - 1e-9, 1e-46])
def test_dropout_p_must_stay_a_probability_as_a_float32(p):
    """cuDNN takes it as a float32: 1 - 1e-9 would round to 1 (no scale), 1e-46 to 0 (no dropout,
    while the plan would act as if there were)."""
    with pytest.raises(stridedfa.LayoutError, match="stays one as a float32"):
        forward_key(dropout_p=p, rng_state=state())


def test_bottom_right_dropout_is_given_as_a_shifted_top_left_band():
    """cuDNN takes no dropout with a bottom-right mask: the band is shifted, as for a bias."""
    g = forward_key(causal=True, causal_alignment="bottom_right", dropout_p=0.1, rng_state=state())
    plain = forward_key(causal=True, causal_alignment="bottom_right")
    assert g != plain
    i = 2
    for _ in range(len(SLOTS)):
        i += 9 if g[i] else 1
    causal, alignment, left, right = g[i + 1:i + 5]
    assert (alignment, left, right) == (0, -1, S_KV - S_Q)  # top-left, unbounded left, right s_kv - s_q


def test_what_the_core_refuses_with_dropout_is_named():
    lengths = dict(seqlens_q=t((B,), "int32"), seqlens_kv=t((B,), "int32"))
    with pytest.raises(stridedfa.UnsupportedError, match="dropout with a bottom-right causal mask .* padding"):
        forward_key(causal=True, causal_alignment="bottom_right", dropout_p=0.1, rng_state=state(), **lengths)
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1 .*dropout"):
        backward_key(s_q=1, s_kv=1, dropout_p=0.1, rng_state=state())
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        backward_key(dropout_p=0.1, rng_state=state(), sinks=t((H,), "float32"), grad_sinks=t((H,), "float32"))
    # the sinks themselves (no gradient asked) are fine
    backward_key(dropout_p=0.1, rng_state=state(), sinks=t((H,), "float32"))


def test_with_dropout_the_backward_cuts_the_keys_the_forward_cuts():
    """Causal top-left with s_q < s_kv leaves keys s_q.. unseen: both directions cut them (the mask is
    drawn by position), so a bias' gradient, which cuDNN writes packed only, is refused by name."""
    bias = t((1, H, S_Q, S_KV))
    options = dict(causal=True, dropout_p=0.1, rng_state=state(), bias=bias)
    forward_key(**options)
    backward_key(**options)  # without the bias' gradient: runs
    with pytest.raises(stridedfa.UnsupportedError, match="grad_bias: cuDNN writes the bias' gradient only"):
        backward_key(**options, grad_bias=t(bias.shape))
    # without dropout the backward keeps every key for it
    backward_key(causal=True, bias=bias, grad_bias=t(bias.shape))


def test_a_non_packed_bias_cut_to_one_row_and_key_is_refused_with_lse():
    """GPU run 32: cuDNN misreads such a bias into lse; inference (no lse) is allowed."""
    bias = t((1, H, 33, 1))
    args = dict(q=t((B, H, 33, D)), k=t((B, H, 1, D)), v=t((B, H, 1, D)), out=t((B, H, 33, D)), bias=bias,
                causal=True, causal_alignment="bottom_right")
    with pytest.raises(stridedfa.UnsupportedError, match="s_q = s_kv = 1 .*packed"):
        _core._forward_graph_key(**args, lse=t((B, H, 33), "float32"), cudnn_version=92600)
    assert _core._forward_graph_key(**args, cudnn_version=92600)


def test_torch_refuses_before_the_forward_what_its_backward_could_not_run():
    """stridedfa.torch asks the core, before anything runs, what the backward of a dropout step
    would refuse: trainable sinks (cuDNN 9.19 gets their gradient wrong) and s_q = s_kv = 1."""
    torch = pytest.importorskip("torch")
    sfa_torch = pytest.importorskip("stridedfa.torch")
    q, k, v = (torch.zeros(1, 2, 1, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with pytest.raises(stridedfa.UnsupportedError, match="backward with s_q = s_kv = 1 .* and dropout"):
        sfa_torch.attention(q, k, v, dropout_p=0.1)
    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.zeros(2, requires_grad=True)
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        sfa_torch.attention(q, q, q, sinks=sinks, dropout_p=0.1)
    with pytest.raises(ValueError, match="dropout_p"):
        sfa_torch.attention(q, q, q, dropout_p=1.5)
