"""Variable-length (THD) calls on fake CUDA tensors (no GPU): what validation accepts and refuses,
and what the graph-cache key holds -- the bucketed extents that bound a training run's graphs.

q (tokens, h_q, d_qk), k and v (tokens, h_kv, d), out like q with d_v, lse (h_q, tokens),
cu_seqlens int32 (b + 1,). The pointers are never dereferenced.
"""

from __future__ import annotations

import itertools
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

GiB = 1 << 30
_bases = itertools.count(1)
T_Q, T_KV, H_Q, H_KV, D = 1000, 1200, 8, 2, 64


def fake(shape, dtype="bfloat16", strides=None, **kw):
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_bases) * GiB, **kw)


def token_major_lse(tokens):
    """(h_q, tokens) over (tokens, h_q) memory: its strides do not depend on the token count."""
    return fake((H_Q, tokens), "float32", strides=(1, H_Q))


def forward_args(sequences=5, t_q=T_Q, t_kv=T_KV, **change):
    args = {"q": fake((t_q, H_Q, D)), "k": fake((t_kv, H_KV, D)), "v": fake((t_kv, H_KV, D)),
            "out": fake((t_q, H_Q, D)), "lse": token_major_lse(t_q),
            "cu_seqlens_q": fake((sequences + 1,), "int32"), "cu_seqlens_kv": fake((sequences + 1,), "int32")}
    args.update(change)
    return {name: x for name, x in args.items() if x is not None}


def backward_args(**change):
    args = forward_args()
    args.update({"grad_out": fake((T_Q, H_Q, D)), "grad_q": fake((T_Q, H_Q, D)),
                 "grad_k": fake((T_KV, H_KV, D)), "grad_v": fake((T_KV, H_KV, D))})
    args.update(change)
    return {name: x for name, x in args.items() if x is not None}


def validate_forward(**args):
    return _core._validate_forward(**args)


def test_a_thd_call_passes_with_the_token_counts_as_its_seq_axes():
    problem = validate_forward(**forward_args())
    assert problem["sequences"] == 5
    assert (problem["s_q"], problem["s_kv"], problem["h_q"], problem["h_kv"]) == (T_Q, T_KV, H_Q, H_KV)
    _core._validate_backward(**backward_args())


def test_views_in_buffers_of_their_own_pass_at_any_strides():
    # head-major k, v with a gap after each token's heads: verified right on the GPU (run 35)
    k = fake((T_KV, H_KV, D), strides=(D, T_KV * D, 1))
    v = fake((T_KV, H_KV, D), strides=((H_KV + 1) * D, D, 1))
    validate_forward(**forward_args(k=k, v=v))


def packed(n, heads=H_Q):
    base = 0x200000000000
    stride = (3 * heads * D, D, 1)
    return [FakeTensor((T_Q, heads, D), stride, "bfloat16", data=base + i * heads * D * 2) for i in range(n)]


def test_views_of_one_projection_pass_the_forward():
    """q, k, v sliced out of one (tokens, 3, h, d) buffer, and kv-packed with q apart: the forward
    reads them in place (right at every layout, GPU run 37)."""
    q, k, v = packed(3)
    validate_forward(**forward_args(t_kv=T_Q, q=q, k=k, v=v))
    _, k, v = packed(3)
    validate_forward(**forward_args(t_kv=T_Q, k=k, v=v))


@pytest.mark.parametrize("name", ["q", "grad_q"])
@pytest.mark.parametrize("strides", [(D, T_Q * D, 1), ((H_Q + 1) * D, D, 1), (3 * H_Q * D, D, 1)],
                         ids=["head_major", "padded_rows", "qkv_view"])
def test_the_backward_refuses_q_and_grad_q_that_are_not_dense(name, strides):
    """cuDNN 9.19's variable-length backward computes dQ right only from a dense q into a dense dQ
    (GPU run 37: wrong dQ, overwritten dK/dV with grouped heads, one illegal instruction)."""
    with pytest.raises(stridedfa.UnsupportedError, match=rf"^{name}: cuDNN's variable-length backward needs q and "
                                                         r"grad_q dense \(tokens, heads, head_dim\), strides "
                                                         rf"\({H_Q * D}, {D}, 1\)"):
        _core._validate_backward(**backward_args(**{name: fake((T_Q, H_Q, D), strides=strides)}))


def test_the_backward_takes_k_v_and_the_other_gradients_at_any_strides():
    k = FakeTensor((T_KV, H_KV, D), (3 * H_KV * D, D, 1), "bfloat16", data=0x500000000000)
    v = FakeTensor((T_KV, H_KV, D), (3 * H_KV * D, D, 1), "bfloat16", data=0x500000000000 + 2 * H_KV * D)
    grad_out = fake((T_Q, H_Q, D), strides=(D, T_Q * D, 1))
    grad_k = fake((T_KV, H_KV, D), strides=((H_KV + 1) * D, D, 1))
    _core._validate_backward(**backward_args(k=k, v=v, grad_out=grad_out, grad_k=grad_k))


def test_an_mqa_backward_is_refused_by_name_and_the_adapters_repeat_the_head():
    """GPU run 39: cuDNN 9.19's varlen backward gets MQA's dK wrong at every layout."""
    one = {name: fake((T_KV, 1, D)) for name in ("k", "v", "grad_k", "grad_v")}
    with pytest.raises(stridedfa.UnsupportedError, match=r"^grad_k: cuDNN 9\.19's variable-length backward computes "
                                                         r"a wrong dK when one key/value head serves 8"):
        _core._backward_graph_key(**backward_args(**one), sm_version=90)
    _core._forward_graph_key(**forward_args(k=one["k"], v=one["v"]), sm_version=90)  # the forward is right
    torch = pytest.importorskip("torch")
    import stridedfa.torch as st

    cu = torch.empty(4, dtype=torch.int32, device="meta")
    q = torch.empty(100, 6, 64, dtype=torch.bfloat16, device="meta", requires_grad=True)
    k, v = (torch.empty(120, 1, 64, dtype=torch.bfloat16, device="meta", requires_grad=True) for _ in range(2))
    st.varlen_attention(q, k, v, cu, cu, causal=True).sum().backward()
    assert k.grad.shape == v.grad.shape == (120, 1, 64) and q.grad.shape == (100, 6, 64)


def test_a_single_heads_stride_is_canonical_in_the_graph():
    """MQA's one k/v head: its stride is free, and cuDNN lays out grouped-head workspaces from it
    (GPU run 38), so any given value reads as d -- one graph."""
    def key(head_stride):
        k = fake((T_KV, 1, D), strides=(D, head_stride, 1))
        v = fake((T_KV, 1, D), strides=(D + 8, head_stride + 8, 1))
        return _core._forward_graph_key(**forward_args(k=k, v=v), sm_version=90)
    assert key(D) == key(T_KV * D) == key(72)


@pytest.mark.parametrize("name, wrong, match", [
    ("cu_seqlens_q", fake((6,), "int64"), r"^cu_seqlens_q: dtype int64 .*int32"),
    ("cu_seqlens_kv", fake((7,), "int32"), r"cu_seqlens_q has 6 entries but cu_seqlens_kv 7"),
    ("cu_seqlens_q", fake((6, 1), "int32"), r"^cu_seqlens_q: expected shape \(batch \+ 1,\)"),
    ("cu_seqlens_q", fake((6,), "int32", strides=(2,)), r"^cu_seqlens_q: axis 0 has stride 2"),
    ("q", fake((1, T_Q, H_Q, D)), r"^q: with cu_seqlens .*expected 3 axes \(tokens, heads, head_dim\)"),
    ("lse", fake((T_Q, H_Q), "float32"), r"^lse: shape .* does not match"),
    ("lse", fake((H_Q, T_Q)), r"^lse: dtype bfloat16 .*float32"),
    ("out", fake((T_Q + 1, H_Q, D)), r"^out: shape"),
    ("k", fake((T_KV, 3, D)), r"^v: axis 1 \(heads\) is 2 but k's is 3"),
])
def test_bad_operands_are_refused_by_name(name, wrong, match):
    with pytest.raises(stridedfa.LayoutError, match=match):
        validate_forward(**forward_args(**{name: wrong}))


def test_one_side_of_the_starts_alone_is_refused():
    with pytest.raises(stridedfa.LayoutError, match="needs both cu_seqlens_q and cu_seqlens_kv"):
        validate_forward(**forward_args(cu_seqlens_kv=None))


def test_cu_seqlens_on_the_host_are_refused():
    with pytest.raises(stridedfa.LayoutError, match="cu_seqlens_q needs a CUDA device"):
        validate_forward(**forward_args(cu_seqlens_q=FakeTensor((6,), None, "int32", device=(1, 0))))


@pytest.mark.parametrize("name, operand", [
    ("bias", lambda: fake((1, H_Q, T_Q, T_KV))), ("alibi_slopes", lambda: fake((H_Q,), "float32"))])
def test_score_operands_are_refused_in_a_varlen_call(name, operand):
    with pytest.raises(stridedfa.UnsupportedError, match=rf"^{name} is not supported in a variable-length call"):
        validate_forward(**forward_args(**{name: operand()}))


def test_padding_lengths_and_cu_seqlens_are_not_mixed():
    with pytest.raises(stridedfa.LayoutError, match="seqlens_q .*cannot be combined with cu_seqlens"):
        validate_forward(**forward_args(seqlens_q=fake((5,), "int32")))


def test_an_output_overlapping_an_input_is_refused():
    args = forward_args()
    args["out"] = args["q"]
    with pytest.raises(stridedfa.LayoutError, match="out overlaps q"):
        validate_forward(**args)


def test_offsets_beyond_int32_are_refused():
    # cuDNN's ragged offsets are int32 elements: 2^31 elements of token reach cannot be told.
    tokens = (1 << 31) // (H_Q * D) + 1
    q = fake((tokens, H_Q, D))
    with pytest.raises(stridedfa.UnsupportedError, match="int32 ragged offsets"):
        validate_forward(**forward_args(t_q=tokens, q=q, out=fake((tokens, H_Q, D)), lse=None))


def test_max_seqlen_must_be_a_python_int():
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int or None"):
        validate_forward(**forward_args(), max_seqlen_q=1.5)
    with pytest.raises(ValueError, match=r"max_seqlen_kv must be in \[1, 2\*\*31\)"):
        validate_forward(**forward_args(), max_seqlen_kv=0)


def key(sequences, t_q, t_kv=None, **options):
    t_kv = t_q if t_kv is None else t_kv
    args = forward_args(sequences=sequences, t_q=t_q, t_kv=t_kv, k=fake((t_kv, H_KV, D)), v=fake((t_kv, H_KV, D)))
    return _core._forward_graph_key(**args, **options)


def test_the_key_buckets_token_counts_and_sequences():
    assert key(9, 1000) == key(10, 1001)  # 9 and 10 sequences pad to 10; 1000 and 1001 tokens to 1024
    assert key(5, 1000) != key(11, 1000)
    assert key(5, 1000) != key(5, 1100)  # 1100 tokens pad to 1280
    assert key(5, 1000, max_seqlen_q=100) != key(5, 1000)
    assert key(5, 1000, max_seqlen_q=100) == key(5, 1000, max_seqlen_q=101)  # both pad to 112
    assert key(5, 1000, causal=True) != key(5, 1000)


def test_a_head_major_lse_is_keyed_by_its_token_count():
    # (h, tokens) contiguous: its head stride is the token count, which the key then holds
    head_major = [_core._forward_graph_key(**forward_args(t_q=t, lse=fake((H_Q, t), "float32"),
                                                          q=fake((t, H_Q, D)), out=fake((t, H_Q, D))))
                  for t in (1000, 1001)]
    assert head_major[0] != head_major[1]


def test_the_key_holds_the_token_strides():
    args = forward_args()
    base = _core._forward_graph_key(**args)
    # the same q as a slice of a (tokens, 3, h, d) projection: another token stride, another graph
    args["q"] = fake((T_Q, H_Q, D), strides=(3 * H_Q * D, D, 1))
    assert _core._forward_graph_key(**args) != base


def test_a_training_run_over_random_documents_builds_few_graphs():
    """1,000 steps of 16k-token batches of documents with lengths uniform in [64, 4096] (the last
    one cut to fit): the distinct forward and backward keys, i.e. the graphs built, stay <= 16."""
    rng = random.Random(0)
    keys = set()
    for _ in range(1000):
        lengths, left = [], 16384
        while left > 0:
            n = min(rng.randint(64, 4096), left)
            lengths.append(n)
            left -= n
        keys.add(key(len(lengths), 16384, causal=True))
    assert len(keys) <= 8, len(keys)


def _ptxas():
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc  # nvidia-cuda-nvcc-cu12: the PTX assembler, no GPU needed
    except ImportError:
        return None
    candidate = Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas"
    return str(candidate) if candidate.exists() else None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_offsets_kernel_assembles(arch, tmp_path):
    """The hand-written PTX of the offsets kernel (JIT-compiled by the driver at run time) is
    valid for the GPUs cuDNN's attention runs on."""
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("no ptxas (pip install nvidia-cuda-nvcc-cu12)")
    source = Path(__file__).parents[1] / "cpp" / "src" / "ragged_offsets.ptx.inc"
    text = source.read_text()
    ptx = text[text.index('R"PTX(') + len('R"PTX('):text.rindex(')PTX"')]
    (tmp_path / "k.ptx").write_text(ptx)
    result = subprocess.run([ptxas, f"-arch={arch}", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert sys.platform.startswith("linux")


def test_the_torch_entry_point_refuses_cpu_tensors_and_tensor_max_seqlen():
    torch = pytest.importorskip("torch")
    import stridedfa.torch as st

    q = torch.zeros(10, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(stridedfa.LayoutError, match="needs a CUDA device"):
        st.varlen_attention(q, q, q, cu, cu)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        st.varlen_attention(q, q, q, cu, cu, torch.tensor(10))


def test_the_torch_operators_trace_with_fake_tensors():
    """Shapes and strides of the fakes: out (total_q, h_q, d_v) contiguous, lse (h_q, total_q) over
    token-major memory, gradients contiguous -- what the real kernels return."""
    torch = pytest.importorskip("torch")

    import stridedfa.torch  # noqa: F401 (registers the operators)

    # meta tensors run the fake kernels
    q = torch.empty(100, 8, 64, dtype=torch.bfloat16, device="meta")
    kv = torch.empty(120, 2, 128, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(4, dtype=torch.int32, device="meta")
    out, lse = torch.ops.stridedfa.varlen_forward(q, kv[..., :64], kv, cu, cu, 0, 0, None, True, "top_left",
                                                  -1, -1, None, None, 0.0, None, False)
    assert out.shape == (100, 8, 128) and out.is_contiguous()
    assert lse.shape == (8, 100) and lse.stride() == (1, 8)
    grads = torch.ops.stridedfa.varlen_backward(out, q, kv[..., :64], kv, out, lse, cu, cu, 0, 0, None, True,
                                                "top_left", -1, -1, None, None, 0.0, None, False)
    assert [g.shape for g in grads] == [(100, 8, 64), (120, 2, 64), (120, 2, 128)]


def test_the_dispatcher_takes_any_dlpack_producer():
    """stridedfa.varlen_attention on a producer without an adapter: validated before anything is
    allocated or launched (no GPU here: the fake tensors fail on their device)."""
    args = forward_args()
    host = [FakeTensor(t.shape, None, t.dtype, device=(1, 0)) for t in (args["q"], args["k"], args["v"])]
    with pytest.raises(stridedfa.LayoutError, match="needs a CUDA device"):
        stridedfa.varlen_attention(*host, args["cu_seqlens_q"], args["cu_seqlens_kv"])
    with pytest.raises(stridedfa.LayoutError, match=r"^q: with cu_seqlens \(a variable-length call\) expected 3 axes"):
        stridedfa.varlen_attention(fake((1, T_Q, H_Q, D)), args["k"], args["v"], args["cu_seqlens_q"],
                                   args["cu_seqlens_kv"])
    with pytest.raises(TypeError, match="takes no option 'bias'"):
        stridedfa.varlen_attention(args["q"], args["k"], args["v"], args["cu_seqlens_q"], args["cu_seqlens_kv"],
                                   bias=args["q"])


def test_a_backward_without_queries_zeroes_the_key_gradients():
    # no query tokens: dK and dV are zeros, filled without cuDNN -- not a refusal
    args = backward_args(q=fake((0, H_Q, D)), out=fake((0, H_Q, D)), lse=token_major_lse(0),
                         grad_out=fake((0, H_Q, D)), grad_q=fake((0, H_Q, D)))
    problem = _core._validate_backward(**args)
    assert problem["s_q"] == 0 and not problem["nothing_to_do"]
    assert _core._backward_graph_key(**args) == ()  # nothing for cuDNN


def test_the_varlen_backward_is_refused_by_name_where_cudnn_cannot_run_it():
    forward = _core._forward_graph_key(**forward_args(), sm_version=80)
    assert forward  # the forward runs on Ampere
    with pytest.raises(stridedfa.UnsupportedError, match=r"backward is not supported on compute capability 8\.x"):
        _core._backward_graph_key(**backward_args(), sm_version=80)
    with pytest.raises(stridedfa.UnsupportedError, match=r"compute capability 12\.x"):
        _core._backward_graph_key(**backward_args(), sm_version=120)
    assert _core._backward_graph_key(**backward_args(), sm_version=90)


# --- Fuzzed strides: what validation accepts and refuses for THD operands -------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def thd_layouts(draw, tokens, heads, dim):
    """(strides, ok): a (tokens, heads, dim) bfloat16 layout with random token and head strides,
    token- or head-major with gaps, and whether cuDNN's rules admit it (head_dim contiguous,
    strides of axes with extent > 1 positive multiples of 8 elements)."""
    head_major = draw(st.booleans())
    gap = draw(st.integers(0, 3)) * draw(st.sampled_from([8, 1]))  # 1: a misaligned gap
    d_stride = draw(st.sampled_from([1, 1, 1, 2]))
    row = dim * d_stride + gap
    token, head = (row, tokens * row + gap) if head_major else (heads * row + gap, row)
    sign = draw(st.sampled_from([1, 1, 1, -1]))
    token *= sign
    strides = (token, head, d_stride)
    ok = d_stride == 1 and all(s > 0 and s % 8 == 0 for s, n in zip(strides[:2], (tokens, heads)) if n > 1)
    return strides, ok


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fuzzed_thd_strides_are_accepted_exactly_when_cudnn_can_read_them(data):
    tokens = data.draw(st.sampled_from([1, 2, 37, 1000]))
    heads = data.draw(st.sampled_from([1, 2, 8]))
    name = data.draw(st.sampled_from(["q", "k", "v", "out"]))
    strides, ok = data.draw(thd_layouts(tokens, heads, 64))
    span = sum(abs(s) * (n - 1) for s, n in zip(strides, (tokens, heads, 64))) + 1
    base = 0x300000000000 + next(_bases) * GiB + (span * 2 if strides[0] < 0 else 0)
    tensor = FakeTensor((tokens, heads, 64), strides, "bfloat16", data=base)
    args = forward_args(t_q=tokens, t_kv=tokens)
    args["q"], args["out"] = fake((tokens, heads, 64)), fake((tokens, heads, 64))
    args["k"], args["v"] = fake((tokens, heads, 64)), fake((tokens, heads, 64))
    args["lse"] = fake((heads, tokens), "float32", strides=(1, heads))
    args[name] = tensor
    if ok:
        problem = validate_forward(**args)
        assert problem["s_q"] == tokens and problem["sequences"] == 5
    else:
        with pytest.raises(stridedfa.LayoutError, match=rf"^{name}\b"):
            validate_forward(**args)


def test_the_packed_varlen_entry_point_reads_a_fused_projection():
    """Shapes through the fake kernels (meta tensors): (total, 3, h, d) and (total, h, 3, d) with
    q, k, v inside, (total, 2, h, d) with q apart; the gradient is one tensor of packed's shape."""
    torch = pytest.importorskip("torch")
    import stridedfa.torch as st

    cu = torch.empty(4, dtype=torch.int32, device="meta")
    for shape, dim in (((100, 3, 4, 64), 1), ((100, 4, 3, 64), 2)):
        packed = torch.empty(shape, dtype=torch.bfloat16, device="meta", requires_grad=True)
        out = st.varlen_packed_attention(packed, dim, cu, causal=True)
        assert out.shape == (100, 4, 64)
        out.sum().backward()
        assert packed.grad.shape == shape
    kv = torch.empty(120, 2, 2, 64, dtype=torch.bfloat16, device="meta")
    q = torch.empty(100, 8, 64, dtype=torch.bfloat16, device="meta")
    assert st.varlen_packed_attention(kv, 1, cu, cu, q=q).shape == (100, 8, 64)
    with pytest.raises(ValueError, match="extent 3 .* without q, or 2"):
        st.varlen_packed_attention(kv, 1, cu)
    with pytest.raises(ValueError, match=r"packed must be \(total, n, h, d\)"):
        st.varlen_packed_attention(q, 1, cu)
