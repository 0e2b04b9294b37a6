"""One attention configuration (:class:`Case`), its tensors (:class:`Run`) and the
shared forward/backward/check steps of the GPU tests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .checks import TOLERANCES, assert_close, assert_close_to_scale, assert_fully_written, bitexact_mismatch
from .layouts import (
    as_dtype,
    layout_tensor,
    make_generator,
    make_qkv,
    poisoned_like_strided,
    poisoned_lse,
    poisoned_qkv,
)
from .torch_ref import torch_reference, torch_reference_grads

DEVICE = "cuda"


@dataclass(frozen=True)
class Case:
    """Shapes, dtype, options and where every tensor lives.

    ``layout``: q/k/v layout (:data:`helpers.layouts.QKV_LAYOUTS`); ``out_layout`` and
    ``dout_layout``: :data:`helpers.layouts.TENSOR_LAYOUTS`; ``grad_layout``: q/k/v layout of
    grad_q/k/v (a packed one writes the three gradients into one buffer)."""

    layout: str = "bhsd"
    dtype: str = "bf16"
    b: int = 2
    h_q: int = 4
    h_kv: int = 4
    s_q: int = 256
    s_kv: int = 256
    d_qk: int = 64
    d_v: int = 64
    causal: bool = False
    alignment: str = "top_left"
    scale: float | None = None
    out_layout: str = "bhsd"
    dout_layout: str = "bhsd"
    grad_layout: str = "bhsd"

    @property
    def torch_dtype(self) -> torch.dtype:
        return as_dtype(self.dtype)

    @property
    def dims(self):
        return (self.b, self.h_q, self.h_kv, self.s_q, self.s_kv, self.d_qk, self.d_v)

    @property
    def out_shape(self):
        return (self.b, self.h_q, self.s_q, self.d_v)

    @property
    def options(self) -> dict:
        """Keyword arguments shared by sdpa_forward and sdpa_backward."""
        return dict(scale=self.scale, causal=self.causal, causal_alignment=self.alignment)

    @property
    def ref_options(self) -> dict:
        return dict(scale=self.scale, causal=self.causal, alignment=self.alignment)

    def replace(self, **changes) -> Case:
        return dataclasses.replace(self, **changes)

    def contiguous(self) -> Case:
        """The same case with every tensor in plain bhsd layout."""
        return self.replace(layout="bhsd", out_layout="bhsd", dout_layout="bhsd",
                            grad_layout="bhsd")


@dataclass
class Run:
    """Inputs and (poisoned, then written) outputs of one forward + backward."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    out_bases: tuple = ()
    grad_bases: tuple = ()

    @property
    def inputs(self):
        return self.q, self.k, self.v, self.dout

    @property
    def results(self) -> dict:
        return {"out": self.out, "lse": self.lse, "grad_q": self.dq, "grad_k": self.dk,
                "grad_v": self.dv}


def random_inputs(case: Case, seed: int):
    """Fresh N(0, 1) q, k, v (in ``case.layout``) and grad_out (in ``case.dout_layout``)."""
    q, k, v, _ = make_qkv(case.layout, *case.dims, case.torch_dtype, DEVICE, seed)
    dout, _ = layout_tensor(case.out_shape, case.dout_layout, dtype=case.torch_dtype,
                            device=DEVICE, gen=make_generator(seed + 1))
    return q, k, v, dout


def build(case: Case, seed: int, inputs=None) -> Run:
    """Inputs (fresh random, or ``inputs`` = (q, k, v, grad_out)) and NaN-poisoned outputs
    in the case's layouts."""
    q, k, v, dout = random_inputs(case, seed) if inputs is None else inputs
    dtype = case.torch_dtype
    out, out_base = poisoned_like_strided(case.out_shape, case.out_layout, dtype=dtype,
                                          device=DEVICE)
    lse = poisoned_lse(case.b, case.h_q, case.s_q, DEVICE)
    dq, dk, dv, grad_bases = poisoned_qkv(case.grad_layout, *case.dims, dtype, DEVICE)
    return Run(q, k, v, dout, out, lse, dq, dk, dv, (out_base,), grad_bases)


def forward(run: Run, options: dict, **extra) -> None:
    import stridedfa
    stridedfa.sdpa_forward(run.q, run.k, run.v, run.out, lse=run.lse, **options, **extra)


def backward(run: Run, options: dict, **extra) -> None:
    import stridedfa
    stridedfa.sdpa_backward(run.q, run.k, run.v, run.out, run.dout, run.lse,
                            run.dq, run.dk, run.dv, **options, **extra)


def run_case(case: Case, seed: int, inputs=None) -> Run:
    """Build, run sdpa_forward then sdpa_backward (with the forward's lse), synchronize."""
    run = build(case, seed, inputs)
    forward(run, case.options)
    backward(run, case.options)
    torch.cuda.synchronize()
    return run


CACHE_COUNTERS = ("hits", "misses", "builds")


def cache_counters() -> dict:
    """stridedfa.cache_info()'s hits, misses and builds."""
    import stridedfa
    info = stridedfa.cache_info()
    return {k: info[k] for k in CACHE_COUNTERS}


def cache_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in CACHE_COUNTERS}


def check_fully_written(run: Run) -> None:
    assert_fully_written({"out": run.out}, run.out_bases)
    assert_fully_written({"lse": run.lse}, (run.lse,))
    assert_fully_written({"grad_q": run.dq, "grad_k": run.dk, "grad_v": run.dv}, run.grad_bases)


def check_forward(out, lse, q, k, v, dtype: torch.dtype, ref_options: dict) -> None:
    """out (and lse, unless None) close to the reference."""
    tol = TOLERANCES[dtype]
    ref_out, ref_lse = torch_reference(q, k, v, **ref_options)
    assert_close(out, ref_out, atol=tol.out_atol, rtol=tol.out_rtol, name="out")
    if lse is not None:
        assert_close(lse.reshape(ref_lse.shape), ref_lse, atol=tol.lse_atol, name="lse")


def check_grads(grads, q, k, v, dout, dtype: torch.dtype, ref_options: dict) -> None:
    tol = TOLERANCES[dtype]
    refs = torch_reference_grads(q, k, v, dout, **ref_options)
    for name, got, ref in zip(("grad_q", "grad_k", "grad_v"), grads, refs):
        assert_close_to_scale(got, ref, rel=tol.grad_rel, name=name)


def check_against_reference(run: Run, dtype: torch.dtype, ref_options: dict,
                            backward_too: bool = True) -> None:
    check_forward(run.out, run.lse, run.q, run.k, run.v, dtype, ref_options)
    if backward_too:
        check_grads((run.dq, run.dk, run.dv), run.q, run.k, run.v, run.dout, dtype, ref_options)


def check_bitexact(results: dict, baseline: dict, rerun: dict | None = None) -> list[str]:
    """Compare ``results`` to ``baseline`` bit for bit.

    Raises AssertionError listing every mismatch whose baseline is reproducible. A
    mismatch on a tensor where ``rerun`` (the baseline computed again) differs from the
    baseline cannot be a layout effect (cuDNN's backward may accumulate dQ with atomics);
    those are returned as descriptions so the caller can xfail with them."""
    failures, nondeterministic = [], []
    for name, got in results.items():
        msg = bitexact_mismatch(got, baseline[name])
        if msg is None:
            continue
        if rerun is not None and bitexact_mismatch(rerun[name], baseline[name]) is not None:
            nondeterministic.append(
                f"{name}: {msg}; two identical contiguous runs differ too "
                f"({bitexact_mismatch(rerun[name], baseline[name])})")
        else:
            failures.append(f"{name}: {msg}")
    assert not failures, "not bit-exact vs contiguous copies: " + "; ".join(failures)
    return nondeterministic
