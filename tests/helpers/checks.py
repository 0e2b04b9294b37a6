"""Assertions that print the numbers needed to judge a failure."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    out_atol: float  # |out - ref| <= out_atol + out_rtol * |ref|, elementwise
    out_rtol: float
    lse_atol: float  # |lse - ref| <= lse_atol, elementwise
    grad_rel: float  # max |grad - ref| <= grad_rel * max |ref|, per tensor


TOLERANCES = {
    torch.float16: Tolerance(out_atol=5e-3, out_rtol=5e-3, lse_atol=2e-3, grad_rel=1e-2),
    torch.bfloat16: Tolerance(out_atol=2e-2, out_rtol=1e-2, lse_atol=2e-3, grad_rel=3e-2),
}


def max_abs(t: torch.Tensor) -> float:
    return t.detach().float().abs().max().item() if t.numel() else 0.0


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.numel() == 0:
        return 0.0
    return (actual.detach().float() - expected.detach().float()).abs().max().item()


def _where(mask: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def assert_no_nan(t: torch.Tensor, name: str) -> None:
    bad = torch.isnan(t.detach())
    n = int(bad.sum().item())
    assert n == 0, (f"{name}: {n} of {t.numel()} elements are NaN (left unwritten or "
                    f"computed NaN), first at logical index {_where(bad)}")


def assert_all_nan(t: torch.Tensor, name: str) -> None:
    n = int((~torch.isnan(t.detach())).sum().item())
    assert n == 0, f"{name}: {n} of {t.numel()} poisoned elements were written"


def _check_shapes(actual, expected, name):
    assert actual.shape == expected.shape, \
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"


def assert_close(actual, expected, *, atol, rtol=0.0, name="tensor") -> None:
    """Elementwise ``|a - e| <= atol + rtol * |e|``; no NaN allowed."""
    _check_shapes(actual, expected, name)
    assert_no_nan(actual, name)
    a, e = actual.detach().float(), expected.detach().float()
    err = (a - e).abs()
    bad = err > atol + rtol * e.abs()
    if bad.any():
        idx = _where(bad)
        raise AssertionError(
            f"{name}: max abs err {err.max().item():.3e} (allowed {atol:.1e} + {rtol:.1e}*|ref|, "
            f"max |ref| {max_abs(e):.3e}); {int(bad.sum())} of {a.numel()} elements out of "
            f"tolerance, first at {idx}: got {a[idx].item():.6g}, want {e[idx].item():.6g}")


def assert_close_to_scale(actual, expected, *, rel, name="tensor") -> None:
    """``max |a - e| <= rel * max |e|`` (scale-aware check for gradients); no NaN allowed."""
    _check_shapes(actual, expected, name)
    assert_no_nan(actual, name)
    err, scale = max_abs_err(actual, expected), max_abs(expected)
    assert err <= rel * scale, (
        f"{name}: max abs err {err:.3e} > {rel:.1e} * max |ref| ({scale:.3e}); "
        f"relative {err / max(scale, 1e-30):.3e}")


def bitexact_mismatch(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None when ``a`` and ``b`` hold the same bits (NaN-free), else a description."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)}/{a.dtype} vs {tuple(b.shape)}/{b.dtype}"
    if torch.equal(a, b):
        return None
    diff = a.detach().float() != b.detach().float()
    return (f"{int(diff.sum())} of {a.numel()} elements differ, max abs diff "
            f"{max_abs_err(a, b):.3e}, first at {_where(diff)}")


def assert_bitexact(a, b, name="tensor") -> None:
    msg = bitexact_mismatch(a, b)
    assert msg is None, f"{name} not bit-exact: {msg}"


def assert_fully_written(views: dict, bases) -> None:
    """Every output view is NaN-free, and nothing outside the views (in the poisoned
    buffers behind them) was written. Views must be disjoint and cover parts of ``bases``."""
    for name, view in views.items():
        assert_no_nan(view, name)
    total = sum(b.numel() for b in bases)
    covered = sum(v.numel() for v in views.values())
    still_nan = sum(int(torch.isnan(b.detach()).sum().item()) for b in bases)
    assert still_nan == total - covered, (
        f"{total - covered - still_nan} elements outside the output views were written "
        f"(buffers hold {total} elements, views cover {covered}, {still_nan} still NaN)")
