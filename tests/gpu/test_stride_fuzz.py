"""Stride fuzzing: every tensor (q, k, v, out, grad_out, grad_q/k/v) gets its own random
physical axis order, head-dim padding and spare rows; forward and backward must match the
reference and write exactly their views. (Deterministic: hypothesis derandomized.)"""

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.cases import (DEVICE, Run, backward, check_against_reference,  # noqa: E402
                           check_fully_written, forward)
from helpers.layouts import ORDERS, as_dtype, general_tensor, make_generator, poisoned_lse  # noqa: E402

pytestmark = pytest.mark.gpu

layouts = st.tuples(
    st.sampled_from(ORDERS),
    st.sampled_from([0, 8, 64]),  # spare head-dim columns (multiples of 16 bytes)
    st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(0, 3)),  # spare b, h, s entries
)


@settings(max_examples=24, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_strides_match_reference(data):
    dtype = as_dtype(data.draw(st.sampled_from(["fp16", "bf16"]), label="dtype"))
    b = data.draw(st.sampled_from([1, 2]), label="b")
    h_kv = data.draw(st.sampled_from([1, 2, 4]), label="h_kv")
    h_q = 4
    s_q = data.draw(st.sampled_from([64, 128, 192]), label="s_q")
    s_kv = data.draw(st.sampled_from([64, 128, 256]), label="s_kv")
    d_qk, d_v = data.draw(st.sampled_from([(64, 64), (128, 128), (128, 64)]), label="d_qk,d_v")
    causal = data.draw(st.booleans(), label="causal")
    alignment = data.draw(st.sampled_from(["top_left", "bottom_right"]), label="alignment")
    assume(not (causal and alignment == "bottom_right" and s_q > s_kv))  # rows with no key
    seed = data.draw(st.integers(0, 2**31 - 1), label="seed")
    gen = make_generator(seed)

    shapes = {"q": (b, h_q, s_q, d_qk), "k": (b, h_kv, s_kv, d_qk), "v": (b, h_kv, s_kv, d_v),
              "out": (b, h_q, s_q, d_v)}
    shapes.update(dout=shapes["out"], dq=shapes["q"], dk=shapes["k"], dv=shapes["v"])
    tensors, bases = {}, {}
    for name, shape in shapes.items():
        order, pad_d, extra = data.draw(layouts, label=f"{name} layout")
        fill = "randn" if name in ("q", "k", "v", "dout") else "nan"
        tensors[name], bases[name] = general_tensor(shape, order, pad_d, extra, dtype=dtype,
                                                    device=DEVICE, fill=fill, gen=gen)
    run = Run(**tensors, lse=poisoned_lse(b, h_q, s_q, DEVICE), out_bases=(bases["out"],),
              grad_bases=(bases["dq"], bases["dk"], bases["dv"]))
    options = dict(scale=None, causal=causal, causal_alignment=alignment)
    forward(run, options)
    backward(run, options)
    torch.cuda.synchronize()
    check_fully_written(run)
    check_against_reference(run, dtype, dict(scale=None, causal=causal, alignment=alignment))
