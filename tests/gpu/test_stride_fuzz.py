"""Stride fuzzing at the scale users run: thousands of random layouts through sdpa_forward and
sdpa_backward, each with exactly one outcome.

Valid cases (STRIDEDFA_FUZZ_VALID, default 300; the GPU CI stage runs 10,000): fp16/bf16, GQA/MQA,
every Hopper head dim (32 ... 256, 192/128), s_q and s_kv from 1 to 1000, causal in both alignments,
each of q, k, v, out, grad_out, grad_q/k/v with its own axis order, head-dim padding and spare rows,
packed q/k/v or packed gradients, every tensor at a random aligned offset inside a larger buffer,
extent-1 axes with odd strides, outputs poisoned with NaN. Outcome: equal to the fp32 reference
(error measures with an absolute floor) with every output element written and nothing outside the
views touched -- or refused by cuDNN itself (UnsupportedError, counted with its reason) with the
outputs untouched. A LayoutError on a valid layout is a failure.

Variants ride on the valid cases (helpers.fuzz.variant_of): a sliding window, padding lengths (one
side or both), a softcap and the deterministic backward, against the same reference.

Invalid cases (STRIDEDFA_FUZZ_INVALID, default 150; CI: 2,000): a valid case with one defect --
misaligned pointer or stride, strided head_dim, negative, zero or absurd strides, an output
overlapping an input or another output, wrong dtype, device or shape, a read-only output. Outcome:
LayoutError before anything is launched, every output still all NaN.

Counts per outcome go to $STRIDEDFA_FUZZ_REPORT (JSON) when set. Graph builds bound the cost (one per
new layout, ~80 ms each): cases run in batches whose library calls go to worker threads, so cuDNN
builds their graphs in parallel; helpers.fuzz says how shapes and recipes are drawn.
"""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.cuda import require_cuda

torch = require_cuda()

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import stridedfa  # noqa: E402
from helpers import fuzz  # noqa: E402
from helpers.checks import TOLERANCES  # noqa: E402
from helpers.fake_dlpack import FakeTensor  # noqa: E402
from helpers.torch_ref import torch_reference, torch_reference_all, visible  # noqa: E402

pytestmark = pytest.mark.gpu

N_VALID = int(os.environ.get("STRIDEDFA_FUZZ_VALID", "300"))
N_INVALID = int(os.environ.get("STRIDEDFA_FUZZ_INVALID", "150"))
FUZZ_SETTINGS = dict(deadline=None, database=None, phases=[Phase.generate], print_blob=False,
                     suppress_health_check=list(HealthCheck))
REPORT = {}


# --- One valid case -----------------------------------------------------------------------------

class Case:
    def __init__(self, shape_index, recipe_index, seed):
        self.label = f"shape {shape_index} {fuzz.SHAPES[shape_index]}, recipe {recipe_index}, seed {seed}"
        self.rng = random.Random(seed)
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        b, h_q, h_kv, s_q, s_kv, d_qk, d_v = fuzz.SHAPES[shape_index]
        recipe = fuzz.RECIPES[recipe_index]
        self.dtype = recipe.dtype
        alignment = recipe.alignment
        self.options = dict(causal=recipe.causal, causal_alignment=alignment)
        self.ref_options = dict(causal=recipe.causal, alignment=alignment)
        self.lengths = {}
        self._draw_variant(b, h_q, s_q, s_kv)
        shapes = {"q": (b, h_q, s_q, d_qk), "k": (b, h_kv, s_kv, d_qk), "v": (b, h_kv, s_kv, d_v),
                  "out": (b, h_q, s_q, d_v), "dout": (b, h_q, s_q, d_v)}
        shapes.update(dq=shapes["q"], dk=shapes["k"], dv=shapes["v"])
        self.shapes = shapes
        packable = h_q == h_kv and s_q == s_kv and d_qk == d_v
        self.t, self.bases = {}, {}
        for group, fill, packed in ((("q", "k", "v"), "randn", recipe.packed_qkv and packable),
                                    (("dq", "dk", "dv"), "nan", recipe.packed_grads and packable)):
            if packed:
                placed = fuzz.place_packed([shapes[n] for n in group], group, recipe.tensors[group[0]],
                                           self.dtype, fill=fill, gen=self.gen, rng=self.rng,
                                           inner_three=recipe.three_inside_heads)
            else:
                placed = [fuzz.place(shapes[n], recipe.tensors[n], self.dtype, fill=fill, gen=self.gen,
                                     rng=self.rng) for n in group]
            for name, p in zip(group, placed):
                self.t[name] = p.view
            self.bases[group] = list({id(p.base): p.base for p in placed}.values())
        for name, fill in (("out", "nan"), ("dout", "randn")):
            p = fuzz.place(shapes[name], recipe.tensors[name], self.dtype, fill=fill, gen=self.gen,
                           rng=self.rng)
            self.t[name], self.bases[(name,)] = p.view, [p.base]
        self.t["lse"], self.bases[("lse",)] = self._lse(b, h_q, s_q)

    def _draw_variant(self, b, h_q, s_q, s_kv):
        """A window, padding lengths, a softcap, sinks and/or the deterministic backward on a share
        of the cases (fuzz.variant_of draws them; sinks only where every valid row sees a key and
        s_q > 1, as cuDNN runs them)."""
        window, lengths, deterministic, softcap = fuzz.variant_of(self.rng, b, s_q, s_kv, self.options)
        if window is not None:
            self.options["window"] = self.ref_options["window"] = window
        if softcap is not None:
            self.options["softcap"] = self.ref_options["softcap"] = softcap
        self.deterministic = deterministic
        for name, values in lengths.items():
            tensor = torch.tensor(values, device="cuda", dtype=torch.int32)
            self.lengths[name] = self.ref_options[name] = tensor
        self.sinks = self.grad_sinks = None
        if self.rng.random() < 0.15 and s_q > 1 and not self._has_rows_without_keys(b, s_q, s_kv):
            self.sinks = 2.0 * torch.randn(h_q, generator=self.gen, device="cuda")
            self.ref_options["sinks"] = self.sinks
        self.bias = self.grad_bias = None
        bottom_right_padded = self.options["causal_alignment"] == "bottom_right" and lengths
        if self.rng.random() < 0.15 and not bottom_right_padded:  # cuDNN's bottom-right mask takes no bias
            self.bias, bias_label = fuzz.draw_bias(self.rng, self.gen, (b, h_q, s_q, s_kv), self.dtype)
            self.ref_options["bias"] = self.bias
        self.alibi_slopes = None
        if self.rng.random() < 0.1:  # any positive slopes, one per query head
            self.alibi_slopes = 0.5 * torch.rand(h_q, generator=self.gen, device="cuda")
            self.ref_options["alibi_slopes"] = self.alibi_slopes
        # Dropout (not with bottom-right and padding, nor with trainable sinks: refused) with a Philox
        # state at any stride; its reference is the same call on contiguous copies (check()).
        self.dropout_p = 0.0
        if self.rng.random() < 0.12 and not bottom_right_padded and self.sinks is None:
            self.dropout_p = self.rng.choice((0.1, 0.3))
            step = self.rng.choice((1, 2, 5))
            state = torch.zeros(2 * step, device="cuda", dtype=torch.int64)
            state[0], state[step] = self.rng.randrange(1 << 62), self.rng.randrange(1 << 40)
            self.options.update(dropout_p=self.dropout_p, rng_state=state[::step])
        label = fuzz.variant_label(window, lengths, deterministic, softcap)
        self.label += f", variant {label}{', sinks' if self.sinks is not None else ''}"
        if self.bias is not None:
            self.label += f", bias {bias_label}"
        if self.alibi_slopes is not None:
            self.label += ", alibi"
        if self.dropout_p:
            self.label += f", dropout {self.dropout_p}"

    def variants(self) -> tuple[str, ...]:
        """The variants this case exercises, for the per-variant counts of the report."""
        named = {"dropout": self.dropout_p, "bias": self.bias is not None, "alibi": self.alibi_slopes is not None,
                 "sinks": self.sinks is not None, "window": "window" in self.options,
                 "softcap": "softcap" in self.options, "padding": bool(self.lengths)}
        return tuple(name for name, on in named.items() if on)

    def _has_rows_without_keys(self, b, s_q, s_kv):
        o = self.ref_options
        mask = visible(b, s_q, s_kv, o["causal"], o["alignment"], o.get("window"), o.get("seqlens_q"),
                       o.get("seqlens_kv"), device="cpu")
        valid = torch.arange(s_q)[None, :] < (o["seqlens_q"].cpu()[:, None] if "seqlens_q" in o else s_q)
        return bool((~mask[:, 0].any(dim=-1) & valid).any())

    def _sink_args(self, backward):
        args = {}
        if self.sinks is not None:
            args["sinks"] = self.sinks
            if backward:
                self.grad_sinks = args["grad_sinks"] = torch.full_like(self.sinks, float("nan"))
        if self.alibi_slopes is not None:
            args["alibi_slopes"] = self.alibi_slopes
        if self.bias is not None:
            args["bias"] = self.bias
            # its gradient (contiguous, of bias' shape, as the adapters allocate it, poisoned) where
            # cuDNN computes one: not under a softcap or ALiBi
            if backward and "softcap" not in self.options and self.alibi_slopes is None:
                self.grad_bias = args["grad_bias"] = torch.full(self.bias.shape, float("nan"), device="cuda",
                                                                dtype=self.dtype)
        return args

    def _lse(self, b, h, s):
        strides = [h * s, s, 1]
        for axis, extent in enumerate((b, h, s)):
            if extent == 1:
                strides[axis] = self.rng.choice((strides[axis], 0, 3, 999))
        offset = 4 * self.rng.randrange(0, 5)
        base = torch.full((offset + b * h * s + 4,), float("nan"), device="cuda")
        return base.as_strided((b, h, s), strides, offset), [base]

    def forward(self):
        t = self.t
        stridedfa.sdpa_forward(t["q"], t["k"], t["v"], t["out"], lse=t["lse"], **self.options, **self.lengths,
                               **self._sink_args(False))

    def backward(self):
        t = self.t
        stridedfa.sdpa_backward(t["q"], t["k"], t["v"], t["out"], t["dout"], t["lse"], t["dq"],
                                t["dk"], t["dv"], **self.options, **self.lengths, **self._sink_args(True),
                                deterministic=self.deterministic)

    def untouched(self, groups) -> bool:
        torch.cuda.synchronize()
        return all(bool(torch.isnan(base).all()) for g in groups for base in self.bases[g])

    def _contiguous_run(self, with_backward: bool):
        """Dropout's reference: the same call, the same rng_state, on contiguous copies (the mask
        depends on the scores' positions only; test_dropout checks such calls against the fp32
        reference given the mask they drew). Returns (out, lse, grads) in float32."""
        t = self.t
        q, k, v = (t[name].contiguous() for name in ("q", "k", "v"))
        out = torch.empty(*q.shape[:3], v.shape[3], device="cuda", dtype=self.dtype)
        lse = torch.empty(*q.shape[:3], device="cuda")
        extra = self._sink_args(False)  # bias and slopes (no sinks with dropout)
        stridedfa.sdpa_forward(q, k, v, out, lse=lse, **self.options, **self.lengths, **extra)
        if not with_backward:
            return out.float(), lse, ()
        grads = [torch.empty_like(x) for x in (q, k, v)]
        if self.grad_bias is not None:
            grads.append(torch.empty(self.bias.shape, device="cuda", dtype=self.dtype))
        stridedfa.sdpa_backward(q, k, v, out, t["dout"].contiguous(), lse, *grads[:3], **self.options,
                                **self.lengths, **extra, deterministic=self.deterministic,
                                **({"grad_bias": grads[3]} if self.grad_bias is not None else {}))
        return out.float(), lse, tuple(g.float() for g in grads)

    def check(self, with_backward: bool) -> list[str]:
        """What is wrong with the results (empty: all within tolerance and fully written)."""
        t, tol = self.t, TOLERANCES[self.dtype]
        if self.dropout_p:
            ref_out, ref_lse, ref_grads = self._contiguous_run(with_backward)
        elif with_backward:  # one pass for the forward and backward references
            ref_out, ref_lse, ref_grads = torch_reference_all(
                t["q"], t["k"], t["v"], t["dout"], compute_dtype=torch.float32, **self.ref_options)
        else:
            ref_out, ref_lse = torch_reference(t["q"], t["k"], t["v"], compute_dtype=torch.float32,
                                               **self.ref_options)
        metrics = {
            "out elements out of tolerance":
                ((t["out"].float() - ref_out).abs() > tol.out_atol + tol.out_rtol * ref_out.abs()).sum()
                + torch.isnan(t["out"]).sum(),
            "lse max error": fuzz.max_error(t["lse"], ref_lse),
        }
        written = {("out",): [t["out"]], ("lse",): [t["lse"]]}
        refs = {}
        if with_backward:
            refs = dict(zip(("dq", "dk", "dv"), ref_grads))
            extra = list(ref_grads[3:])  # the sinks' gradient, then the bias', as given
            if self.sinks is not None:
                ref = extra.pop(0)
                metrics["grad_sinks max error"] = fuzz.max_error(self.grad_sinks, ref)
                metrics["grad_sinks scale"] = ref.abs().max()
            if self.grad_bias is not None:  # asked for only where cuDNN computes it
                ref = extra.pop(0)
                metrics["grad_bias max error"] = fuzz.max_error(self.grad_bias, ref)
                metrics["grad_bias scale"] = ref.abs().max()
            for name, ref in refs.items():
                metrics[f"{name} max error"] = fuzz.max_error(t[name], ref)
                metrics[f"{name} scale"] = ref.abs().max()
            written[("dq", "dk", "dv")] = [t["dq"], t["dk"], t["dv"]]
        for group, views in written.items():
            metrics[f"{'/'.join(group)} unwritten or spilled"] = (
                sum(torch.isnan(b).sum() for b in self.bases[group])
                - (sum(b.numel() for b in self.bases[group]) - fuzz.expected_elements(views))).abs()
        names = list(metrics)
        values = torch.stack([torch.as_tensor(metrics[n], device="cuda").float() for n in names]).tolist()
        got = dict(zip(names, values))
        problems = [f"{n} = {got[n]:g}" for n in names if ("out of tolerance" in n or "unwritten" in n)
                    and got[n] != 0]
        if not got["lse max error"] <= tol.lse_atol:
            problems.append(f"lse max error {got['lse max error']:.3e} > {tol.lse_atol}")
        for name in refs:
            err, scale = got[f"{name} max error"], max(got[f"{name} scale"], 1.0)
            if not err <= tol.grad_rel * scale:  # NaN fails too
                problems.append(f"{name} max error {err:.3e} > {tol.grad_rel} * max(max|ref|, 1) = "
                                f"{tol.grad_rel * scale:.3e}")
        # The sinks' gradient is a sum over every batch and row of terms that each carry the
        # rounding of the forward's out (cuDNN reads it back): that error grows as sqrt(terms).
        rows = self.shapes["q"][0] * self.shapes["q"][2]
        for name in ("grad_sinks", "grad_bias"):
            if f"{name} max error" in got:
                err, scale = got[f"{name} max error"], max(got[f"{name} scale"], 1.0)
                if name == "grad_sinks":
                    scale *= max(1.0, (rows / 64) ** 0.5)
                if not err <= tol.grad_rel * scale:  # NaN (unwritten) fails too
                    problems.append(f"{name} max error {err:.3e} > {tol.grad_rel * scale:.3e}")
        return problems


def library_calls(case: Case):
    """The library calls of a valid case: the forward, then the backward if the forward ran.
    Returns (the phase that raised, its exception), or (None, None). Thread-safe: the fuzz runs a
    batch of cases on several threads, so cuDNN builds their graphs in parallel."""
    for phase, call in (("forward", case.forward), ("backward", case.backward)):
        try:
            call()
        except Exception as error:  # judged on the main thread
            return phase, error
    return None, None


def judge_valid(case: Case, phase, error, outcomes: fuzz.Outcomes) -> None:
    outcomes = _TalliedOutcomes(outcomes, case.variants())
    if phase == "forward" and isinstance(error, stridedfa.UnsupportedError):
        ok = case.untouched([("out",), ("lse",)])
        outcomes.add("unsupported by cuDNN (forward)" if ok else "FAIL: refused but outputs written",
                     detail=case.label, reason=fuzz.reason_of(error))
    elif phase == "backward" and isinstance(error, stridedfa.UnsupportedError):
        problems = case.check(with_backward=False)
        ok = not problems and case.untouched([("dq", "dk", "dv")])
        outcomes.add("forward matches; backward unsupported by cuDNN" if ok else
                     "FAIL: forward mismatch or refused backward wrote", detail=f"{case.label}: {problems}",
                     reason=fuzz.reason_of(error))
    elif isinstance(error, stridedfa.LayoutError):
        outcomes.add("FAIL: valid layout refused", detail=f"{case.label}, {phase}: {error}",
                     reason=fuzz.reason_of(error))
    elif error is not None:
        outcomes.add(f"FAIL: {type(error).__name__} on a valid layout", detail=f"{case.label}, {phase}: {error}")
    else:
        problems = case.check(with_backward=True)
        if problems:
            outcomes.add("FAIL: silent mismatch or unwritten output", detail=f"{case.label}: {problems}")
        else:
            outcomes.add("matches the reference")


class _TalliedOutcomes:
    """Outcomes.add that also counts the outcome for each of the case's variants."""

    def __init__(self, outcomes, variants):
        self._outcomes, self._variants = outcomes, variants

    def add(self, outcome, detail=None, reason=None):
        self._outcomes.add(outcome, detail=detail, reason=reason, variants=self._variants)


# --- One invalid case: a valid case with one defect -----------------------------------------------

def _own_buffer_view(shape, strides, dtype, offset=0, fill="randn", gen=None):
    extent = offset + 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))
    base = torch.randn(extent, device="cuda", generator=gen).to(dtype) if fill == "randn" else \
        torch.full((extent,), float("nan"), device="cuda", dtype=dtype)
    return base.as_strided(shape, strides, offset), base


def _fake_over(view, strides=None, **kwargs):
    """A hand-made DLPack producer over the real memory of `view` with other strides."""
    dtype = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}[view.dtype]
    return FakeTensor(tuple(view.shape), strides or view.stride(), dtype, data=view.data_ptr(),
                      device=(2, view.device.index or 0), **kwargs)


MUTATIONS = ("misaligned_pointer", "misaligned_stride", "strided_head_dim", "negative_stride",
             "zero_stride", "absurd_stride", "output_overlaps_input", "outputs_overlap",
             "wrong_dtype", "mixed_dtypes", "cpu_operand", "wrong_shape", "read_only_output",
             "wrong_lse", "bad_lengths", "bad_bias")


def mutate(case: Case, kind: str, phase: str, rng: random.Random, keep: list) -> tuple[str, str]:
    """Gives `case` one defect for `phase`; returns (the tensor that got it, the defect: a
    mutation the drawn tensor cannot take becomes a bad lse)."""
    t = case.t
    inputs = ["q", "k", "v"] + (["out", "dout"] if phase == "backward" else [])
    outputs = ["out"] if phase == "forward" else ["dq", "dk", "dv"]
    name = rng.choice(inputs + outputs)
    x = t[name]
    shape, strides = tuple(x.shape), list(x.stride())
    movable = [a for a in range(3) if shape[a] > 1] or [None]
    axis = rng.choice(movable)
    fill = "nan" if name in outputs else "randn"
    if kind == "misaligned_pointer":
        t[name], base = _own_buffer_view(shape, strides, x.dtype, offset=rng.randrange(1, 8), fill=fill)
    elif kind == "misaligned_stride" and axis is not None:
        strides[axis] += rng.randrange(1, 8)
        t[name], base = _own_buffer_view(shape, strides, x.dtype, fill=fill)
    elif kind == "strided_head_dim" or (kind == "misaligned_stride" and axis is None):
        strides = [s * 2 for s in strides[:3]] + [2]
        t[name], base = _own_buffer_view(shape, strides, x.dtype, fill=fill)
    elif kind == "negative_stride" and axis is not None:
        base_view, base = _own_buffer_view(shape, strides, x.dtype, fill=fill)
        flipped = list(strides)
        flipped[axis] = -strides[axis]
        start = base_view.data_ptr() + (shape[axis] - 1) * strides[axis] * x.element_size()
        t[name] = _fake_over(base_view, flipped)
        t[name].data = start  # the last element along `axis` first: the same bytes, walked backwards
    elif kind == "zero_stride" and axis is not None:
        small = list(shape)
        small[axis] = 1
        src, base = _own_buffer_view(tuple(small), strides, x.dtype, fill=fill)
        t[name] = src.expand(shape)
    elif kind == "absurd_stride":
        bad = list(strides)
        bad[axis if axis is not None else 3] = rng.choice((2**62, 2**63 - 64, -(2**62)))
        t[name], base = _fake_over(x, bad), None
    elif kind == "output_overlaps_input":
        name = outputs[0]
        src = t["q"]  # out (d_v <= d_qk) or dq fits inside q's memory
        t[name], base = src.as_strided(t[name].shape, src.stride(), src.storage_offset()), None
    elif kind == "outputs_overlap" and phase == "backward":
        name = "dv" if t["dk"].shape == t["dv"].shape else "dq"
        other = "dk" if name == "dv" else "dq"
        if name == "dq":  # grad_q on grad_out's memory is an output-input overlap of its own kind
            t["dq"] = t["dout"].as_strided(t["dq"].shape, t["dout"].stride(), t["dout"].storage_offset()) \
                if t["dout"].shape == t["dq"].shape else t["q"]
        else:
            t[name] = t[other]
        base = None
    elif kind == "wrong_dtype":
        t[name] = x.float() if name in inputs else torch.full(shape, float("nan"), device="cuda")
        base = None
    elif kind == "mixed_dtypes":
        other = torch.float16 if x.dtype == torch.bfloat16 else torch.bfloat16
        t[name] = x.to(other) if name in inputs else torch.full(shape, float("nan"), device="cuda", dtype=other)
        base = None
    elif kind == "cpu_operand":
        t[name], base = x.cpu(), None
    elif kind == "wrong_shape":
        bigger = list(shape)
        bigger[rng.choice((0, 1, 2, 3))] += rng.choice((1, 8))
        t[name], base = _own_buffer_view(tuple(bigger), _dense(bigger), x.dtype, fill=fill)
    elif kind == "read_only_output":
        name = rng.choice(outputs)
        t[name], base = _fake_over(t[name], read_only=True), None
    elif kind == "bad_lengths":  # padding lengths of the wrong dtype, shape or device
        name = rng.choice(("seqlens_q", "seqlens_kv"))
        b = t["q"].shape[0]
        defect = rng.choice(("int64", "shape", "cpu"))
        lengths = torch.full((b,), 1, device="cuda", dtype=torch.int32)
        if defect == "int64":
            lengths = lengths.long()
        elif defect == "shape":
            lengths = torch.full((b + 1,), 1, device="cuda", dtype=torch.int32)
        else:
            lengths = lengths.cpu()
        case.lengths = dict(case.lengths, **{name: lengths})
        base = None
    elif kind == "bad_bias":  # a score bias cuDNN cannot read or that does not fit the problem
        name = "bias"
        b, h_q, s_q, _ = t["q"].shape
        s_kv = t["k"].shape[2]
        full = (b, h_q, s_q, s_kv)
        defect = rng.choice(("key_stride", "negative_stride", "float32", "shape", "cpu"))
        if defect == "key_stride" and s_kv > 1:  # every other key of a wider buffer
            bias = torch.randn((b, h_q, s_q, 2 * s_kv), device="cuda").to(case.dtype)[..., ::2]
        elif defect == "negative_stride" and s_q > 1:  # rows walked backwards over the same bytes
            rows, base = _own_buffer_view(full, _dense(full), case.dtype)
            flipped = list(rows.stride())
            flipped[2] = -flipped[2]
            bias = _fake_over(rows, flipped)
            bias.data = rows.data_ptr() + (s_q - 1) * rows.stride(2) * rows.element_size()
            keep.append(base)
        elif defect == "float32":
            bias = torch.randn(full, device="cuda")
        elif defect == "cpu":
            bias = torch.randn(full).to(case.dtype)
        else:
            bias = torch.randn((b, h_q, s_q, s_kv + 1), device="cuda").to(case.dtype)
        case.bias = bias
        base = None
    else:  # "wrong_lse", and mutations the drawn tensor cannot take
        name, kind = "lse", "wrong_lse"
        lse = t["lse"]
        t["lse"], base = (lse.to(torch.float16) if rng.random() < 0.5 else
                          torch.full((lse.shape[0], lse.shape[1], lse.shape[2] + 1), float("nan"),
                                     device="cuda")), None
    keep.append(base)
    return name, kind


def _dense(shape):
    strides, step = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = step
        step *= shape[i]
    return strides


def valid_forward_first(case: Case, phase: str):
    """A backward case starts from a valid forward (out and lse to differentiate with); returns
    cuDNN's refusal of it, if any. Thread-safe, like library_calls."""
    if phase != "backward":
        return None
    try:
        case.forward()
    except Exception as error:  # judged on the main thread
        return error
    return None


def run_invalid(case: Case, make_case, refused_forward, kind: str, phase: str, rng: random.Random,
                outcomes: fuzz.Outcomes) -> None:
    keep = []
    if refused_forward is not None and not isinstance(refused_forward, stridedfa.UnsupportedError):
        outcomes.add(f"FAIL: valid forward raised {type(refused_forward).__name__}",
                     detail=f"{case.label}: {refused_forward}")
        return
    if refused_forward is not None:  # cuDNN cannot run this forward: test the forward's defects instead
        phase, case = "forward", make_case()
    watched = [("out",), ("lse",)] if phase == "forward" else [("dq", "dk", "dv")]
    name, kind = mutate(case, kind, phase, rng, keep)
    label = f"{case.label}, {phase}, {kind} on {name}"
    try:
        case.forward() if phase == "forward" else case.backward()
    except stridedfa.LayoutError as error:
        ok = case.untouched(watched)
        outcomes.add("refused with LayoutError, outputs untouched" if ok else "FAIL: refused but outputs written",
                     detail=label, reason=f"{kind}: {fuzz.reason_of(error)}")
        return
    except (stridedfa.StridedFAError, TypeError, ValueError) as error:
        outcomes.add(f"FAIL: refused with {type(error).__name__}, not LayoutError", detail=f"{label}: {error}")
        return
    torch.cuda.synchronize()
    outcomes.add("FAIL: invalid layout accepted", detail=label)


# --- The tests -----------------------------------------------------------------------------------

# Hypothesis draws batches of cases; a batch's library calls run on worker threads (graph builds,
# one per new layout, set the pace, and cuDNN builds on several threads at once), its checks on
# the main thread. Every case still gets fresh data and its own layout.
BATCH = 32
_WORKERS = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="fuzz")
one_case = st.tuples(st.integers(0, len(fuzz.SHAPES) - 1), st.integers(0, len(fuzz.RECIPES) - 1),
                     st.integers(0, 2**31 - 1))


def batches(n):
    size = min(BATCH, n)
    return dict(max_examples=-(-n // size)), st.lists(one_case, min_size=size, max_size=size)


def _report(kind, outcomes, started, builds_before, complete):
    report = {"cases": sum(outcomes.counts.values()), "complete": complete,
              "seconds": round(time.perf_counter() - started, 1),
              "graph_builds": stridedfa.cache_info()["builds"] - builds_before, **outcomes.as_dict(),
              "cudnn": stridedfa.info().get("cudnn"), "torch": torch.__version__}
    REPORT[kind] = report
    fuzz.write_report(REPORT)
    return report


def _progress(kind, outcomes, started, builds_before, every=500):
    """Rewrites the report every `every` cases, so a run stopped by its time limit still says what
    it saw."""
    done = sum(outcomes.counts.values())
    if done // every > REPORT.get(kind, {}).get("cases", 0) // every:
        _report(kind, outcomes, started, builds_before, complete=False)


def _finish(kind, outcomes, started, builds_before):
    report = _report(kind, outcomes, started, builds_before, complete=True)
    failures = {k: v for k, v in outcomes.counts.items() if k.startswith("FAIL")}
    assert not failures, f"{failures}; first examples: { {k: outcomes.examples[k][:3] for k in failures} }"
    return report


def test_random_valid_layouts_match_the_reference_or_are_refused_by_cudnn():
    outcomes, started, builds = fuzz.Outcomes(), time.perf_counter(), stridedfa.cache_info()["builds"]
    examples, batch = batches(N_VALID)

    @settings(**examples, **FUZZ_SETTINGS)
    @given(batch)
    def one(drawn):
        batch_cases = [Case(*drawn_case) for drawn_case in drawn]
        results = list(_WORKERS.map(library_calls, batch_cases))
        torch.cuda.synchronize()
        for case, (phase, error) in zip(batch_cases, results):
            judge_valid(case, phase, error, outcomes)
        _progress("valid", outcomes, started, builds)

    one()
    report = _finish("valid", outcomes, started, builds)
    assert report["counts"].get("matches the reference", 0) >= 0.8 * report["cases"], report["counts"]


def test_random_invalid_layouts_are_refused_before_launch():
    outcomes, started, builds = fuzz.Outcomes(), time.perf_counter(), stridedfa.cache_info()["builds"]
    examples, batch = batches(N_INVALID)
    defects = st.lists(st.tuples(st.sampled_from(MUTATIONS), st.sampled_from(("forward", "backward"))),
                       min_size=BATCH, max_size=BATCH)

    @settings(**examples, **FUZZ_SETTINGS)
    @given(batch, defects)
    def one(drawn, drawn_defects):
        batch_cases = [Case(*drawn_case) for drawn_case in drawn]
        phases = [phase for _, phase in drawn_defects[:len(drawn)]]
        refusals = list(_WORKERS.map(valid_forward_first, batch_cases, phases))
        torch.cuda.synchronize()
        for case, drawn_case, (kind, phase), refused in zip(batch_cases, drawn, drawn_defects, refusals):
            seed = drawn_case[2]
            run_invalid(case, lambda drawn_case=drawn_case: Case(*drawn_case), refused, kind, phase,
                        random.Random(seed ^ 0x5EED), outcomes)
        _progress("invalid", outcomes, started, builds)

    one()
    _finish("invalid", outcomes, started, builds)
