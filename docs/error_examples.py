"""The examples of docs/pages/errors.md, provoked for real on a machine without a GPU.

Every example hands stridedfa a call that must be refused before anything is launched: the tensors are
``FakeTensor``s from tests/helpers/fake_dlpack.py (DLPack descriptions of memory at addresses chosen
here, never dereferenced), so the messages are the ones the installed package produces, with
addresses that do not change from run to run. ``python docs/error_examples.py`` prints them;
tests/tooling/test_docs_errors.py checks that every message still appears in errors.md word for word.

Only calls that fail validation are made: a well-formed call on fake memory would reach cuDNN.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import stridedfa
from stridedfa import _core, _loader

ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30
BASE = 0x100000000000  # 256-byte aligned; buffer n lives at BASE + n GiB
B, H, S, D = 2, 4, 16, 64


def _fake_dlpack():
    spec = importlib.util.spec_from_file_location("fake_dlpack", ROOT / "tests" / "helpers" / "fake_dlpack.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def examples() -> list[dict]:
    """[{"title", "call", "exception", "message"}] in the order errors.md shows them."""
    fake = _fake_dlpack()
    bufs = iter(range(1, 1000))

    def t(shape=(B, H, S, D), strides=None, dtype="bfloat16", **kw):
        kw.setdefault("data", BASE + next(bufs) * GiB)
        return fake.FakeTensor(shape, strides, dtype, **kw)

    def packed_qkv():
        base = BASE + next(bufs) * GiB
        strides = (S * 3 * H * D, D, 3 * H * D, 1)
        return [t((B, H, S, D), strides, data=base + i * H * D * 2) for i in range(3)]

    cases = []

    def case(title, call, fn):
        try:
            fn()
        except (stridedfa.StridedFAError, ValueError) as error:
            cases.append({"title": title, "call": call, "exception": type(error).__name__, "message": str(error)})
        else:  # pragma: no cover - a refusal that stopped happening is a documentation bug
            raise AssertionError(f"{title}: {call} was not refused")

    fwd = stridedfa.sdpa_forward
    case("a tensor on the host", "sdpa_forward(q, k_on_cpu, v, out)",
         lambda: fwd(t(), t(device=(fake.CPU, 0)), t(), t()))
    case("an unsupported dtype", "sdpa_forward(q_float32, k, v, out)",
         lambda: fwd(t(dtype="float32"), t(), t(), t()))
    case("mismatched shapes", "sdpa_forward(q, k_with_head_dim_32, v, out)",
         lambda: fwd(t(), t((B, H, S, 32)), t(), t()))
    case("heads that do not group", "sdpa_forward(q_4_heads, k_3_heads, v_3_heads, out)",
         lambda: fwd(t(), t((B, 3, S, D)), t((B, 3, S, D)), t()))
    case("head_dim not contiguous", "sdpa_forward(q[..., ::2]-like view, k, v, out)",
         lambda: fwd(t(strides=(H * S * D * 2, S * D * 2, D * 2, 2)), t(), t(), t()))
    case("a broadcast (stride 0) input", "sdpa_forward(q, k.expand(...), v, out)",
         lambda: fwd(t(), t(strides=(S * D, 0, D, 1)), t(), t()))
    case("a stride that is not a multiple of 16 bytes", "sdpa_forward(q, k, v_rows_padded_by_4, out)",
         lambda: fwd(t(), t(), t(strides=(H * S * 68, S * 68, 68, 1)), t()))
    case("a pointer off a 16-byte boundary", "sdpa_forward(q_shifted_by_8_bytes, k, v, out)",
         lambda: fwd(t(data=BASE + next(bufs) * GiB + 8), t(), t(), t()))
    qkv = packed_qkv()
    case("an output over an input", "sdpa_forward(q, k, v, out_over_k)  # q, k, v: views of one packed buffer",
         lambda: fwd(*qkv, t(qkv[0].shape, qkv[0].strides, data=qkv[1].data)))
    case("an output that overlaps itself", "sdpa_forward(q, k, v, out_with_heads_stride_32)",
         lambda: fwd(t(), t(), t(), t(strides=(H * S * D, 32, H * 32 + D, 1))))
    dq = t()
    case("gradients that overlap each other", "sdpa_backward(..., grad_q, grad_k_8_rows_into_grad_q, grad_v)",
         lambda: stridedfa.sdpa_backward(t(), t(), t(), t(), t(), t((B, H, S), dtype="float32"), dq,
                                         t(data=dq.data + D * 2 * 8), t()))
    case("a bad option value", "sdpa_forward(q, k, v, out, scale=float('nan'))",
         lambda: fwd(t(), t(), t(), t(), scale=float("nan")))
    case("a misspelt option", "sdpa_forward(q, k, v, out, causal=True, causal_alignment='center')",
         lambda: fwd(t(), t(), t(), t(), causal=True, causal_alignment="center"))
    case("dropout without its random state", "sdpa_forward(q, k, v, out, dropout_p=0.1)",
         lambda: fwd(t(), t(), t(), t(), dropout_p=0.1))
    case("no keys for a non-empty output", "sdpa_forward(q, k_with_0_keys, v_with_0_keys, out)",
         lambda: fwd(t(), t((B, H, 0, D)), t((B, H, 0, D)), t()))
    tokens = 48
    case("an option the variable-length path lacks",
         "sdpa_forward(q, k, v, out, cu_seqlens_q=cu, cu_seqlens_kv=cu, alibi_slopes=slopes)",
         lambda: _core._validate_forward(
             t((tokens, H, D)), t((tokens, H, D)), t((tokens, H, D)), t((tokens, H, D)),
             cu_seqlens_q=t((4,), dtype="int32"), cu_seqlens_kv=t((4,), dtype="int32"),
             alibi_slopes=t((H,), dtype="float32")))
    blocks, block = 64, 16
    case("an option the paged KV cache lacks",
         "sdpa_forward(q, k_cache, v_cache, out, block_table=table, seqlens_kv=lengths, alibi_slopes=slopes)",
         lambda: _core._validate_forward(
             t((B, H, 1, D)), t((blocks, H, block, D)), t((blocks, H, block, D)), t((B, H, 1, D)),
             block_table=t((B, 12), dtype="int32"), seqlens_kv=t((B,), dtype="int32"),
             alibi_slopes=t((H,), dtype="float32")))
    override = os.environ.pop("STRIDEDFA_CUDNN_LIBRARY", None)  # the example is the variable unset
    try:
        case("cuDNN not found where it was asked for", "stridedfa._loader.find_cudnn(steps=('override',))",
             lambda: _loader.find_cudnn(steps=("override",)))
    finally:
        if override is not None:
            os.environ["STRIDEDFA_CUDNN_LIBRARY"] = override
    return cases


def main() -> None:
    for example in examples():
        print(f"## {example['title']}\n{example['call']}\n{example['exception']}: {example['message']}\n")


if __name__ == "__main__":
    main()
