"""stridedfa.warm_up: the graphs it prepares are the graphs the calls it describes use.

Without a GPU the warm-up's calls are checked by their graph-cache keys: each must equal the key of
the core call a torch user makes with tensors of that layout (described here as hand-made DLPack
tensors in the strides the torch adapter passes and allocates), so that a warmed-up graph is the
one the first real call finds. tests/gpu/test_warm_up.py runs them on the GPU.
"""

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor, row_major
from stridedfa import _core
from stridedfa._warm_up import _calls_of

B, S_Q, S_KV, H_Q, H_KV, D = 2, 96, 160, 8, 2, 64


class _Memory:
    """Distinct, aligned fake addresses, one per tensor."""

    def __init__(self):
        self.next = 0x100000000000

    def tensor(self, shape, strides=None, dtype="bfloat16"):
        self.next += 1 << 32
        return FakeTensor(shape, strides, dtype, data=self.next)

    def bshd(self, b, h, s, d):  # torch's x.transpose(1, 2) of a contiguous (b, s, h, d) tensor
        return self.tensor((b, h, s, d), (s * h * d, d, h * d, 1))


def _warm_up_keys(config):
    return [_core._warm_up_shapes(*call[:4], 0, **call[4], key_only=True) for call in _calls_of(config)]


def _torch_keys(*, backward, with_lse=True, seqlens=False, sinks=False, grad_sinks=None, alibi=False, bias=None,
                grad_bias=False, dropout_p=0.0, **options):
    """The keys of stridedfa.torch.attention's core calls on bshd views (outputs in q's layout)."""
    m = _Memory()
    q, k, v = m.bshd(B, H_Q, S_Q, D), m.bshd(B, H_KV, S_KV, D), m.bshd(B, H_KV, S_KV, D)
    out = m.bshd(B, H_Q, S_Q, D)
    lse = m.tensor((B, H_Q, S_Q), None, "float32") if with_lse else None
    extra = {}
    if seqlens == "separate":
        extra.update(seqlens_q=m.tensor((B,), None, "int32"), seqlens_kv=m.tensor((B,), None, "int32"))
    elif seqlens:  # one tensor passed as both, as self-attention passes it
        lengths = m.tensor((B,), None, "int32")
        extra.update(seqlens_q=lengths, seqlens_kv=lengths)
    if sinks:
        extra["sinks"] = m.tensor((H_Q,), None, "float32")
    if alibi:
        extra["alibi_slopes"] = m.tensor((H_Q,), None, "float32")
    if bias is not None:
        extra["bias"] = m.tensor(bias, None, "bfloat16")
    if dropout_p:
        extra.update(dropout_p=dropout_p, rng_state=m.tensor((2,), None, "int64"))
    forward_options = {name: value for name, value in options.items() if name != "deterministic"}
    keys = [_core._forward_graph_key(q, k, v, out, lse, **forward_options, **extra)]
    if backward:
        grads = (m.bshd(B, H_Q, S_Q, D), m.bshd(B, H_KV, S_KV, D), m.bshd(B, H_KV, S_KV, D))
        if sinks and (grad_sinks if grad_sinks is not None else not dropout_p):
            extra["grad_sinks"] = m.tensor((H_Q,), None, "float32")
        if grad_bias:
            extra["grad_bias"] = m.tensor(bias, None, "bfloat16")
        keys.append(_core._backward_graph_key(q, k, v, out, m.bshd(B, H_Q, S_Q, D), lse, *grads, **options, **extra))
    return keys


BSHD = {"q": (B, S_Q, H_Q, D), "k": (B, S_KV, H_KV, D)}


@pytest.mark.parametrize("options", [
    {"causal": True},
    {"causal": True, "causal_alignment": "bottom_right", "window": (32, 0)},
    {"scale": 0.1, "softcap": 30.0, "deterministic": True},
])
def test_a_training_configuration_prepares_the_graphs_of_the_torch_calls(options):
    assert _warm_up_keys({**BSHD, **options}) == _torch_keys(backward=True, **options)


def test_an_inference_configuration_prepares_the_forward_without_statistics():
    keys = _warm_up_keys({**BSHD, "causal": True, "backward": False})
    assert keys == _torch_keys(backward=False, with_lse=False, causal=True)
    assert keys != _warm_up_keys({**BSHD, "causal": True, "backward": False, "return_lse": True})


@pytest.mark.parametrize("operands", [
    {"padded": True}, {"padded": "separate"}, {"sinks": True}, {"sinks": True, "dropout_p": 0.1}, {"alibi": True},
    {"dropout_p": 0.1}, {"bias": (1, H_Q, S_Q, S_KV)}, {"bias": (B, H_Q, S_Q, S_KV), "grad_bias": True},
])
def test_optional_operands_prepare_the_graphs_of_calls_with_them(operands):
    torch_options = {("seqlens" if name == "padded" else name): value for name, value in operands.items()}
    assert _warm_up_keys({**BSHD, **operands}) == _torch_keys(backward=True, **torch_options)


@pytest.mark.parametrize("padded", [True, "separate"])
def test_a_padded_bottom_right_configuration_prepares_the_graph_of_its_call(padded):
    """One lengths tensor for both sides lets the core align a bottom-right mask top-left (s_q =
    s_kv): another graph than two tensors give, and each configuration prepares its own."""
    square = {"q": (B, S_KV, H_Q, D), "k": (B, S_KV, H_KV, D)}
    options = {"causal": True, "causal_alignment": "bottom_right"}
    keys = _warm_up_keys({**square, **options, "padded": padded})
    m = _Memory()
    q, k, v, out = m.bshd(B, H_Q, S_KV, D), m.bshd(B, H_KV, S_KV, D), m.bshd(B, H_KV, S_KV, D), m.bshd(B, H_Q, S_KV, D)
    one = m.tensor((B,), None, "int32")
    lengths = (one, one) if padded is True else (one, m.tensor((B,), None, "int32"))
    expected = _core._forward_graph_key(q, k, v, out, m.tensor((B, H_Q, S_KV), None, "float32"), **options,
                                        seqlens_q=lengths[0], seqlens_kv=lengths[1])
    assert keys[0] == expected


def test_trainable_sinks_with_dropout_are_refused_and_frozen_ones_prepared():
    # the default for sinks with dropout: frozen (trainable ones are refused)
    assert _warm_up_keys({**BSHD, "sinks": True, "dropout_p": 0.1})
    with pytest.raises(stridedfa.UnsupportedError, match="sinks' gradient with dropout"):
        _validate_configuration({**BSHD, "sinks": True, "grad_sinks": True, "dropout_p": 0.1})


def _validate_configuration(config):
    for call in _calls_of(config):
        _core._validate_shapes(*call[:4], **call[4])


def test_a_variable_length_configuration_prepares_the_graphs_of_the_torch_varlen_calls():
    tokens, sequences = 1000, 7
    m = _Memory()
    q, k, v, out = (m.tensor((tokens, h, D)) for h in (H_Q, H_KV, H_KV, H_Q))
    lse = m.tensor((H_Q, tokens), (1, H_Q), "float32")  # _torch_varlen._lse_like: (h, total) over (total, h)
    cu_q, cu_kv = m.tensor((sequences + 1,), None, "int32"), m.tensor((sequences + 1,), None, "int32")
    expected = _core._forward_graph_key(q, k, v, out, lse, causal=True, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv,
                                        max_seqlen_q=300, max_seqlen_kv=300)
    grads = (m.tensor((tokens, h, D)) for h in (H_Q, H_KV, H_KV))  # _varlen_backward_impl's dense gradients
    expected_backward = _core._backward_graph_key(q, k, v, out, m.tensor((tokens, H_Q, D)), lse, *grads, causal=True,
                                                  cu_seqlens_q=cu_q, cu_seqlens_kv=cu_kv, max_seqlen_q=300,
                                                  max_seqlen_kv=300)
    config = {"q": (tokens, H_Q, D), "k": (tokens, H_KV, D), "layout": "thd", "sequences": sequences, "causal": True,
              "max_seqlen_q": 300, "max_seqlen_kv": 300}
    assert _warm_up_keys(config) == [expected, expected_backward]


def test_variable_length_calls_of_one_bucket_share_the_warmed_up_graph():
    def key(tokens, sequences):
        return _warm_up_keys({"q": (tokens, H_Q, D), "k": (tokens, H_KV, D), "layout": "thd", "sequences": sequences,
                              "backward": False})[0]
    assert key(1000, 9) == key(1010, 10)  # tokens and sequences in the same buckets
    assert key(1000, 9) != key(1000, 11)


def test_length_buckets_are_the_cores_buckets():
    buckets = stridedfa.length_buckets(100)
    assert buckets[:12] == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56]
    assert buckets[-1] >= 100 and buckets[-2] < 100
    assert all(_core._length_bucket(n) in buckets for n in range(1, 101))
    assert buckets == sorted(set(buckets))


@pytest.mark.parametrize("config, error, words", [
    ({"q": (1, 2, 3, 64)}, ValueError, "shapes of q and k"),
    ({**BSHD, "causl": True}, TypeError, "causl"),
    ({**BSHD, "layout": "sbhd"}, ValueError, "layout"),
    ({**BSHD, "dtype": "float32"}, ValueError, "dtype"),
    ({**BSHD, "q": 5}, TypeError, "shape"),
    ({"q": (100, H_Q, D), "k": (100, H_KV, D), "layout": "thd"}, ValueError, "sequences"),
    ({**BSHD, "sequences": 3}, ValueError, "thd"),
    ({**BSHD, "backward": "no"}, TypeError, "backward must be True or False"),
    ({**BSHD, "padded": "yes"}, ValueError, "padded must be"),
    ({**BSHD, "padded": 1}, ValueError, "padded must be"),
    ({"q": (100, H_Q, D), "k": (100, H_KV, D), "layout": "thd", "sequences": 0}, ValueError, "positive int"),
    ({"q": (100, H_Q, D), "k": (100, H_KV, D), "layout": "thd", "sequences": 7.9}, ValueError, "positive int"),
])
def test_malformed_configurations_are_refused_by_name(config, error, words):
    with pytest.raises(error, match=words):
        stridedfa.warm_up([config])


def test_a_configuration_the_calls_would_refuse_is_refused_before_anything_is_built():
    with pytest.raises(stridedfa.LayoutError, match="head_dim"):
        stridedfa.warm_up([{"q": (B, S_Q, H_Q, D), "k": (B, S_KV, H_KV, D + 8)}])  # q and k disagree
    with pytest.raises(stridedfa.UnsupportedError):
        stridedfa.warm_up([{**BSHD, "bias": (B, H_Q, 1, S_KV), "grad_bias": True}])  # a gradient cuDNN gets wrong


def test_row_major_is_what_bhsd_means():
    config = {"q": (B, H_Q, S_Q, D), "k": (B, H_KV, S_KV, D), "layout": "bhsd", "backward": False}
    m = _Memory()
    q, k, v, out = (m.tensor(s, row_major(s)) for s in ((B, H_Q, S_Q, D), (B, H_KV, S_KV, D), (B, H_KV, S_KV, D),
                                                         (B, H_Q, S_Q, D)))
    assert _warm_up_keys(config) == [_core._forward_graph_key(q, k, v, out, None)]


def test_decoding_steps_of_a_growing_dynamic_cache_find_the_graphs_warmed_per_doubling():
    """transformers' dynamic cache: q of one token cut from a (b, s, h, d) projection, a head-major
    cache one token longer each step. Warming up `layout="bhsd"` at each power of two the cache will
    reach prepares the graph of every step up to it (batch x kv heads a power of two here: with
    others, the cache's rows reach their next power of two at other lengths, and the first such step
    builds)."""
    b, h_q, h_kv, d = 8, 32, 8, 128
    warmed = set()
    for length in (512, 1024, 2048):
        config = {"q": (b, h_q, 1, d), "k": (b, h_kv, length, d), "layout": "bhsd", "causal": True,
                  "causal_alignment": "bottom_right", "backward": False}
        warmed.update(_warm_up_keys(config))
    m = _Memory()
    steps = set()
    for length in range(300, 2049, 7):
        q, out = m.bshd(b, h_q, 1, d), m.bshd(b, h_q, 1, d)
        k, v = (m.tensor((b, h_kv, length, d), row_major((b, h_kv, length, d))) for _ in range(2))
        steps.add(_core._forward_graph_key(q, k, v, out, None, causal=True, causal_alignment="bottom_right"))
    assert steps == warmed and len(warmed) == 3
