"""torch.compile and CUDA graphs: a transformer block with a fused QKV projection and attention on
packed views compiles with fullgraph=True, matches eager bit for bit, does not recompile on a
second call, and runs under CUDA-graph capture (manual and mode="reduce-overhead")."""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

import stridedfa  # noqa: E402
import stridedfa.torch as sfa_torch  # noqa: E402
from helpers.checks import bitexact_mismatch  # noqa: E402

pytestmark = pytest.mark.gpu

B, S, H, D = 2, 256, 4, 64
DTYPE = torch.bfloat16


class Block(torch.nn.Module):
    """Fused QKV projection -> attention on views of the packed projection -> output projection."""

    def __init__(self, entry: str):
        super().__init__()
        self.entry = entry
        self.qkv = torch.nn.Linear(H * D, 3 * H * D, bias=False)
        self.proj = torch.nn.Linear(H * D, H * D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, 3, H, D)
        if self.entry == "packed":
            out = sfa_torch.packed_attention(qkv, 2, causal=True)           # (b, s, h, d)
        else:
            q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))     # zero-copy views
            out = sfa_torch.attention(q, k, v, causal=True).transpose(1, 2)
        return self.proj(out.reshape(b, s, H * D))


def _block(entry, seed):
    torch.manual_seed(seed)
    return Block(entry).to(device="cuda", dtype=DTYPE)


def _x(seed, requires_grad=True):
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    return torch.randn(B, S, H * D, device="cuda", dtype=DTYPE, generator=gen,
                       requires_grad=requires_grad)


def _train_step(model, x, grad_y):
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.backward(grad_y)
    return {"y": y.detach().clone(), "grad_x": x.grad.clone(),
            **{f"grad_{n.removeprefix('_orig_mod.')}": p.grad.clone()
               for n, p in model.named_parameters()}}


def _assert_same(got: dict, want: dict, what: str):
    failures = [f"{name}: {msg}" for name in want
                if (msg := bitexact_mismatch(got[name], want[name])) is not None]
    assert not failures, f"{what} differs from eager: " + "; ".join(failures)


@pytest.mark.parametrize("entry", ["packed", "views"])
def test_fullgraph_compile_matches_eager_bitwise_without_recompiles(entry, seed):
    import torch._dynamo.testing

    torch._dynamo.reset()
    model = _block(entry, seed)
    x = _x(seed)
    grad_y = torch.randn(B, S, H * D, device="cuda", dtype=DTYPE)
    eager = _train_step(model, x, grad_y)
    x.grad = None

    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    with torch._dynamo.config.patch(error_on_recompile=True):
        first = _train_step(compiled, x, grad_y)
        x.grad = None
        x2 = x.detach().clone().requires_grad_()  # a new tensor with the same shape and strides
        second = _train_step(compiled, x2, grad_y)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} frames (graph breaks?)"
    _assert_same(first, eager, "compiled training step")
    _assert_same(second, eager, "second compiled call")

    with torch.no_grad():
        _assert_same({"y": compiled(x)}, {"y": model(x)}, "compiled inference")


@pytest.mark.parametrize("entry", ["packed", "views"])
def test_reduce_overhead_uses_cuda_graphs_and_matches_eager(entry, seed):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _block(entry, seed)
    x = _x(seed, requires_grad=False)
    with torch.no_grad():
        want = model(x).clone()
        compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        for _ in range(4):  # cudagraph trees record on a later call, then replay
            got = compiled(x).clone()
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])
    _assert_same({"y": got}, {"y": want}, "reduce-overhead inference")

    torch._dynamo.reset()
    x = _x(seed)
    grad_y = torch.randn(B, S, H * D, device="cuda", dtype=DTYPE)
    eager = _train_step(model, x, grad_y)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):
        x.grad = None
        got = _train_step(compiled, x, grad_y)
    assert not counters["inductor"].get("cudagraph_skips"), dict(counters["inductor"])
    _assert_same(got, eager, "reduce-overhead training step")


@pytest.mark.parametrize("with_backward", [False, True], ids=["forward", "forward_backward"])
def test_manual_cuda_graph_capture_replays_eager_result(with_backward, seed):
    """Capture attention (and its backward) into a torch.cuda.CUDAGraph; replay on new inputs
    copied into the captured ones. A host sync or a non-capturable allocation inside the captured
    region would make the capture fail."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    packed = torch.randn(B, S, 3, H, D, device="cuda", dtype=DTYPE, generator=gen,
                         requires_grad=with_backward)
    grad_out = torch.randn(B, S, H, D, device="cuda", dtype=DTYPE, generator=gen)

    def step():
        if with_backward:
            out = sfa_torch.packed_attention(packed, 2, causal=True)
            (grad,) = torch.autograd.grad(out, packed, grad_out)
            return out, grad
        q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
        return sfa_torch.attention(q, k, v, causal=True), None

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up: builds the cuDNN graphs outside the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    own_allocations = stridedfa._core._own_workspace_allocations()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            captured_out, captured_grad = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    # Every workspace inside the capture came from torch's (capture-aware) allocator.
    assert stridedfa._core._own_workspace_allocations() == own_allocations

    for round_ in range(2):
        fresh = torch.randn(packed.shape, device="cuda", dtype=DTYPE, generator=gen)
        with torch.no_grad():
            packed.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_grad = step()
        torch.cuda.synchronize()
        _assert_same({"out": captured_out}, {"out": want_out}, f"replay {round_}")
        if with_backward:
            _assert_same({"grad": captured_grad}, {"grad": want_grad}, f"replay {round_} grad")
