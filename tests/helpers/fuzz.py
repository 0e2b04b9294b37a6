"""Building blocks of the stride fuzz (tests/gpu/test_stride_fuzz.py): layout families, tensors
placed at random offsets inside poisoned buffers, one-defect mutations, and the bookkeeping of
outcomes.

Graph builds dominate the fuzz's cost (tens of ms each), and a graph is keyed by every operand's
dims and strides. So a case draws one of SHAPES and one of RECIPES (a recipe fixes dtype, mask and
each tensor's axis order, head-dim padding, spare entries and packing): at most
len(SHAPES) * len(RECIPES) forward and as many backward graphs. Everything a graph does not depend
on is drawn afresh per case: the data, where in its buffer each tensor starts, the strides of its
extent-1 axes, and for the invalid cases the defect.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import re
from dataclasses import dataclass, field

import torch

ORDERS = ("bhs", "bsh", "sbh", "hbs", "hsb", "shb")  # physical order of the b/h/s axes; d is last
NAMES = ("q", "k", "v", "out", "dout", "dq", "dk", "dv")

# (b, h_q, h_kv, s_q, s_kv, d_qk, d_v): every head dim Hopper runs, s from 1 to ~1000 with
# s_q != s_kv, GQA and MQA, extent-1 batch and heads.
SHAPES = (
    (2, 4, 4, 128, 128, 64, 64), (1, 8, 1, 1, 1000, 128, 128), (3, 6, 2, 17, 64, 32, 32),
    (2, 1, 1, 255, 255, 80, 80), (1, 4, 2, 1000, 129, 96, 96), (2, 2, 2, 64, 1, 128, 128),
    (1, 2, 1, 512, 512, 192, 128), (2, 4, 4, 64, 64, 256, 256), (1, 1, 1, 1, 1, 64, 64),
    (2, 8, 4, 129, 1000, 64, 64), (3, 2, 2, 2, 3, 32, 32), (1, 16, 16, 100, 100, 128, 128),
    (2, 4, 1, 300, 200, 80, 80), (1, 3, 3, 64, 512, 96, 96), (2, 2, 1, 1, 64, 256, 256),
    (4, 2, 2, 48, 48, 64, 64), (1, 4, 4, 777, 777, 32, 32), (2, 6, 6, 33, 1, 128, 128),
    (1, 2, 2, 16, 999, 192, 128), (2, 1, 1, 1000, 1000, 64, 64),
)


@dataclass(frozen=True)
class TensorRecipe:
    order: str        # physical order of b/h/s
    pad_d: int        # spare head-dim columns (multiples of 8 elements keep 16-byte alignment)
    extra: tuple      # spare entries along the logical b, h, s axes


@dataclass(frozen=True)
class Recipe:
    dtype: torch.dtype
    causal: bool
    alignment: str
    tensors: dict     # name -> TensorRecipe
    packed_qkv: bool  # q, k, v as slices of one (b, s, 3, h, d)-like buffer when the shape allows
    packed_grads: bool
    three_inside_heads: bool  # packed as (..., h, 3, d) rather than (..., 3, h, d)


def make_recipe(index: int) -> Recipe:
    rng = random.Random(1000 + index)
    tensors = {name: TensorRecipe(rng.choice(ORDERS), rng.choice((0, 0, 8, 16, 64)),
                                  (rng.choice((0, 0, 1)), rng.choice((0, 0, 1, 3)), rng.choice((0, 0, 2, 5))))
               for name in NAMES}
    causal = rng.random() < 0.5
    return Recipe(dtype=rng.choice((torch.float16, torch.bfloat16)), causal=causal,
                  alignment=rng.choice(("top_left", "bottom_right")), tensors=tensors,
                  packed_qkv=rng.random() < 0.25, packed_grads=rng.random() < 0.25,
                  three_inside_heads=rng.random() < 0.5)


RECIPES = tuple(make_recipe(i) for i in range(32))


@dataclass
class Placed:
    """A logical (b, h, s, d) view and the whole poisoned/filled buffer behind it."""
    view: torch.Tensor
    base: torch.Tensor


def _strides_for(shape, recipe: TensorRecipe):
    phys_axes = ["bhs".index(c) for c in recipe.order]
    phys_shape = [shape[a] + recipe.extra[a] for a in phys_axes] + [shape[3] + recipe.pad_d]
    phys_strides, step = [0] * 4, 1
    for i in range(3, -1, -1):
        phys_strides[i] = step
        step *= phys_shape[i]
    strides = [0] * 4
    for i, axis in enumerate(phys_axes):
        strides[axis] = phys_strides[i]
    strides[3] = 1
    return strides, step  # step: elements of the physical buffer


def place(shape, recipe: TensorRecipe, dtype, *, fill: str, gen: torch.Generator, rng: random.Random,
          device="cuda") -> Placed:
    """A view of `shape` with the recipe's layout at a random 16-byte aligned offset inside a
    larger buffer; extent-1 axes get random strides (cuDNN must not care)."""
    strides, elements = _strides_for(shape, recipe)
    for axis in range(3):
        if shape[axis] == 1:
            strides[axis] = rng.choice((strides[axis], 0, 1, 8, 7, 12345, 2**31 + 1))
    offset = 8 * rng.randrange(0, 9)
    total = offset + elements + 8 * rng.randrange(0, 3)
    base = _filled(total, dtype, fill, gen, device)
    return Placed(base.as_strided(shape, strides, offset), base)


def _filled(n, dtype, fill, gen, device):
    if fill == "nan":
        return torch.full((n,), float("nan"), dtype=dtype, device=device)
    return torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dtype)


def place_packed(shapes, names, recipe: TensorRecipe, dtype, *, fill, gen, rng, inner_three,
                 device="cuda"):
    """q, k, v (or dq, dk, dv) as the three slices of one buffer in the recipe's b/h/s order, the
    packing axis just outside h ((..., 3, h, d)) or, with inner_three, just inside ((..., h, 3, d))."""
    b, h, s, d = shapes[0]
    phys_axes = ["bhs".index(c) for c in recipe.order]
    # physical layout: order[0], order[1], order[2] with '3' inserted before h (or after h)
    layout = []
    for axis in phys_axes:
        if axis == 1 and not inner_three:
            layout.append("3")
        layout.append(axis)
        if axis == 1 and inner_three:
            layout.append("3")
    layout.append(3)
    ext = {0: b, 1: h, 2: s, 3: d + recipe.pad_d, "3": 3}
    strides, step = {}, 1
    for item in reversed(layout):
        strides[item] = step
        step *= ext[item]
    offset = 8 * rng.randrange(0, 9)
    base = _filled(offset + step, dtype, fill, gen, device)
    views = []
    for i in range(3):
        st = [strides[0], strides[1], strides[2], 1]
        views.append(base.as_strided((b, h, s, d), st, offset + i * strides["3"]))
    return [Placed(v, base) for v in views]


@dataclass
class Outcomes:
    """Counts per outcome, the reasons of refusals, and the first examples of each failure."""
    counts: collections.Counter = field(default_factory=collections.Counter)
    reasons: collections.Counter = field(default_factory=collections.Counter)
    examples: dict = field(default_factory=lambda: collections.defaultdict(list))
    by_variant: collections.Counter = field(default_factory=collections.Counter)  # "variant: outcome"

    def add(self, outcome: str, detail: str | None = None, reason: str | None = None,
            variants: tuple[str, ...] = ()):
        self.counts[outcome] += 1
        for variant in variants:
            self.by_variant[f"{variant}: {outcome}"] += 1
        if reason is not None:
            self.reasons[f"{outcome}: {reason}"] += 1
        if detail is not None and len(self.examples[outcome]) < 20:
            self.examples[outcome].append(detail)

    def as_dict(self):
        return {"counts": dict(self.counts), "by_variant": dict(sorted(self.by_variant.items())),
                "reasons": dict(self.reasons.most_common()),
                "examples": {k: v for k, v in self.examples.items()}}


def write_report(report: dict) -> None:
    path = os.environ.get("STRIDEDFA_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)


def max_error(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """max |got - ref| as a 0-d float tensor (NaN when got holds a NaN); equal infinities (the
    -inf statistics of rows that see no key) count as no error."""
    got, ref = got.float(), ref.float()
    diff = torch.where(torch.isinf(ref) & (got == ref), torch.zeros_like(ref), (got - ref).abs())
    return diff.max() if diff.numel() else torch.zeros((), device=got.device)


def variant_of(rng: random.Random, b: int, s_q: int, s_kv: int, options: dict):
    """(window or None, {seqlens_q/seqlens_kv: lengths}, deterministic, softcap or None) for a case:
    a window on ~30% of cases, padding lengths on ~25% (one side alone on some), the deterministic
    backward and a softcap on ~15% each. With padding and a mask that can leave rows empty, the
    per-sequence lengths keep s_q <= s_kv (such rows are tested on their own in test_variants.py).
    Lengths of 0 (empty sequences, ~15% of entries) and all-zero batches (~5% of padded cases) are
    drawn too: serving engines pad batches with them."""
    window = None
    if rng.random() < 0.3:
        left = rng.choice((None, 0, 1, 7, 64, 300))
        right = rng.choice((None, 0, 5, 100))
        window = (left if left is not None or right is not None else 16, right)
    lengths = {}
    if rng.random() < 0.25:
        lq = [0 if rng.random() < 0.15 else rng.randint(1, s_q) for _ in range(b)]
        lkv = [0 if rng.random() < 0.15 else rng.randint(1, s_kv) for _ in range(b)]
        if rng.random() < 0.05:
            lq, lkv = [0] * b, [0] * b
        may_empty = options["causal_alignment"] == "bottom_right" or window is not None
        if may_empty:  # every valid row keeps a key: lq <= lkv
            lkv = [max(c, min(a, s_kv)) for a, c in zip(lq, lkv)]
            lq = [min(a, c) for a, c in zip(lq, lkv)]
        side = rng.random()
        if side < 0.7 or (may_empty and s_q > s_kv):
            lengths = {"seqlens_q": lq, "seqlens_kv": lkv}
        elif side < 0.85 and not may_empty:
            lengths = {"seqlens_kv": lkv}
        else:
            lengths = {"seqlens_q": [min(a, s_kv) for a in lq] if may_empty else lq}
    softcap = rng.choice((2.0, 5.0, 30.0)) if rng.random() < 0.15 else None
    return window, lengths, rng.random() < 0.15, softcap


# Bias shapes (NumPy-broadcast to (b, h_q, s_q, s_kv)) and layouts the fuzz draws: full, per head,
# per batch (transformers' masks), 2-D; dense, an expanded view (stride 0 on shared axes), rows of a
# wider buffer. (A bias shared over query rows is refused: cuDNN misreads it.)
BIAS_SHAPES = ("full", "heads", "batch_mask", "2d")
BIAS_LAYOUTS = ("dense", "expanded", "wide_rows")


def draw_bias(rng: random.Random, gen: torch.Generator, full: tuple, dtype):
    """(bias tensor, label): a random shape from BIAS_SHAPES in a random layout from BIAS_LAYOUTS,
    values ~ N(0, 1)."""
    b, h, s_q, s_kv = full
    kind, layout = rng.choice(BIAS_SHAPES), rng.choice(BIAS_LAYOUTS)
    shape = {"full": (b, h, s_q, s_kv), "heads": (1, h, s_q, s_kv), "batch_mask": (b, 1, s_q, s_kv),
             "2d": (s_q, s_kv)}[kind]
    if layout == "expanded" and kind in ("heads", "batch_mask"):  # a view of full shape with stride 0
        small = torch.randn(shape, generator=gen, device="cuda").to(dtype)
        return small.expand(full), f"{kind} expanded"
    if layout == "wide_rows":  # the key axis inside rows of a wider buffer (row stride s_kv + pad)
        pad = rng.choice((8, 24, 1))
        wide = torch.randn((*shape[:-1], s_kv + pad), generator=gen, device="cuda").to(dtype)
        return wide[..., :s_kv], f"{kind} rows of {s_kv + pad}"
    return torch.randn(shape, generator=gen, device="cuda").to(dtype), f"{kind} dense"


def variant_label(window, lengths, deterministic, softcap=None) -> str:
    parts = ([f"window={window}"] if window is not None else []) + [f"{n}={v}" for n, v in lengths.items()]
    parts += [f"softcap={softcap}"] if softcap is not None else []
    return ", ".join(parts + (["deterministic"] if deterministic else [])) or "none"


def reason_of(error: BaseException) -> str:
    """A stable category of an error message for the counts: its first clause, numbers elided."""
    head = re.sub(r"-?\d+", "N", str(error).split(";")[0].split(". ")[0])
    return f"{type(error).__name__}: {head[:140]}"


def expected_elements(views) -> int:
    return sum(math.prod(v.shape) for v in views)
