"""The core's operand table (sdpa_types.hpp kOperands) is what every layer reads: walked here.

For every operand of each op, on fake CUDA tensors (no GPU): the public signatures take the
operands under the table's names (the optional ones as keywords); the validator checks each operand's dtype and
shape as its row says and names the operand; an output may not overlap an input; and the graph
cache key distinguishes every operand's strides. A new operand is a new row, and these tests
cover it without a new line.
"""

from __future__ import annotations

import inspect
import itertools

import pytest

import stridedfa
from helpers.fake_dlpack import FakeTensor
from stridedfa import _core

GiB = 1 << 30
_bases = itertools.count(1)
PROBLEM = {"batch": 2, "h_q": 4, "h_kv": 2, "s_q": 16, "s_kv": 32, "d_qk": 64, "d_v": 128, 1: 1, 2: 2}
TABLE = _core._operands()
OPS = {"forward": stridedfa.sdpa_forward, "backward": stridedfa.sdpa_backward}


def operands(op):
    # cu_seqlens make a call variable-length and a block table makes k and v paged caches, with
    # other shapes for those operands: their rows are walked in test_varlen_validation.py and
    # test_paged_validation.py. The FP8 scaling rows are reserved until FP8 attention lands:
    # test_fp8_rows_are_reserved.
    others = ("cumulative", "page_table", "fp8_scale")
    return [row for row in TABLE if row[op] is not None and row["kind"] not in others]


def shape_of(row, **change):
    extents = dict(PROBLEM, **change)
    shape = tuple(extents[e] for e in row["shape"])
    # statistics as (b, h, s), lengths as (b,), per-head values as (h,), the Philox pair as (2,)
    return {"stats": shape[:3], "lengths": shape[:1], "per_head": shape[1:2], "philox": shape[3:]}.get(
        row["kind"], shape)


DTYPES = {"stats": "float32", "lengths": "int32", "per_head": "float32", "attention": "bfloat16",
          "scores": "bfloat16", "philox": "int64"}
WRONG_DTYPES = {"stats": "float16", "lengths": "int64", "per_head": "float16", "attention": "float32",
                "scores": "float32", "philox": "int32"}


def make(row, shape=None, dtype=None, strides=None):
    shape = shape or shape_of(row)
    dtype = dtype or DTYPES[row["kind"]]
    return FakeTensor(shape, strides, dtype, data=0x100000000000 + next(_bases) * GiB)


# Operands one valid call cannot have together (cuDNN computes no bias gradient under ALiBi's score
# modifier): the first is left out unless asked for, and then the second.
EXCLUSIVE = ("alibi_slopes", "grad_bias")


def call_args(op, **replace):
    """{operand name: tensor} for a valid call, with `replace`d operands."""
    left_out = EXCLUSIVE[1] if EXCLUSIVE[0] in replace else EXCLUSIVE[0]
    return {row["name"]: replace.get(row["name"], make(row)) for row in operands(op) if row["name"] != left_out}


def validate(op, args):
    fn = _core._validate_forward if op == "forward" else _core._validate_backward
    return fn(**args)  # every operand under its table name


def key(op, args):
    # cuDNN 9.26 reads the statistics at any strides (older versions refuse non-packed ones).
    graph_key = _core._forward_graph_key if op == "forward" else _core._backward_graph_key
    return graph_key(**args, cudnn_version=92600)


def test_table_rows_are_in_slot_order_with_names_and_roles():
    assert [row["slot"] for row in TABLE] == list(range(len(TABLE)))
    assert len({row["name"] for row in TABLE}) == len(TABLE)
    for op in OPS:
        roles = {row[op] for row in operands(op)}
        assert roles == {"input", "output"}, op
    assert all(row["shape"][3] == 1 for row in TABLE if row["kind"] == "stats")


@pytest.mark.parametrize("op", OPS)
def test_public_signatures_name_every_operand(op):
    parameters = inspect.signature(OPS[op]).parameters
    for row in operands(op):
        parameter = parameters[row["name"]]
        optional = row[f"{op}_optional"]
        assert (parameter.kind is inspect.Parameter.KEYWORD_ONLY) == optional, row["name"]


@pytest.mark.parametrize("op", OPS)
def test_a_valid_call_passes_and_reports_the_problem(op):
    problem = validate(op, call_args(op))
    assert {k: problem[k] for k in ("b", "h_q", "h_kv", "s_q", "s_kv", "d_qk", "d_v")} == {
        "b": 2, "h_q": 4, "h_kv": 2, "s_q": 16, "s_kv": 32, "d_qk": 64, "d_v": 128}


@pytest.mark.parametrize("op, row", [(op, row) for op in OPS for row in operands(op)],
                         ids=lambda x: x if isinstance(x, str) else x["name"])
def test_every_operand_has_its_dtype_checked_and_named(op, row):
    args = call_args(op, **{row["name"]: make(row, dtype=WRONG_DTYPES[row["kind"]])})
    with pytest.raises(stridedfa.LayoutError, match=rf"^{row['name']}\b.*dtype"):
        validate(op, args)


@pytest.mark.parametrize("op, row", [(op, row) for op in OPS for row in operands(op)],
                         ids=lambda x: x if isinstance(x, str) else x["name"])
def test_every_operand_has_its_shape_checked_and_named(op, row):
    # One more along the operand's last non-unit extent that no other operand fixes alone.
    axis = max(i for i, e in enumerate(row["shape"]) if e != 1)
    extent = row["shape"][axis]
    shape = list(shape_of(row))
    shape[axis - {"per_head": 1, "philox": 3}.get(row["kind"], 0)] += 8  # given as (h,) and (2,)
    args = call_args(op, **{row["name"]: make(row, shape=tuple(shape))})
    with pytest.raises(stridedfa.LayoutError) as error:
        validate(op, args)
    message = str(error.value)
    if row["name"] in ("q", "k", "v"):  # these three define the problem: the clash names one of them
        assert any(name in message for name in ("q", "k", "v")), message
    else:
        assert message.startswith(row["name"]), message
    assert str(PROBLEM[extent] + 8) in message or "multiple" in message, message


@pytest.mark.parametrize("op, row", [(op, row) for op in OPS for row in operands(op) if row[op] == "output"],
                         ids=lambda x: x if isinstance(x, str) else x["name"])
def test_every_output_may_not_overlap_an_input(op, row):
    for other in operands(op):
        if other[op] != "input" or other["kind"] != row["kind"] or shape_of(other) != shape_of(row):
            continue
        args = call_args(op)
        if other["name"] not in args:
            continue
        args[row["name"]] = args[other["name"]]
        with pytest.raises(stridedfa.LayoutError, match=f"{row['name']} overlaps {other['name']}"):
            validate(op, args)


@pytest.mark.parametrize("op, row", [(op, row) for op in OPS for row in operands(op)],
                         ids=lambda x: x if isinstance(x, str) else x["name"])
def test_the_cache_key_holds_every_operands_strides(op, row):
    """...and the presence of every optional operand."""
    args = call_args(op, **({row["name"]: make(row)} if row["name"] in EXCLUSIVE else {}))
    base = key(op, args)
    shape = shape_of(row)
    if row["kind"] == "philox":  # read as two scalars at any strides: dropout_p, which needs it, is keyed
        args.pop("grad_sinks", None)  # cuDNN gets the sinks' gradient wrong under dropout: refused
        base = key(op, args)
        assert key(op, dict(args, dropout_p=0.1)) != base
        assert key(op, dict(args, dropout_p=0.1)) != key(op, dict(args, dropout_p=0.2))
        return
    # Contiguous vectors, and grad_bias (cuDNN writes it packed only): their presence is the layout.
    if row["kind"] in ("lengths", "per_head") or row["name"] == "grad_bias":
        # (one side of the lengths alone is the same graph: the core makes the other side)
        gone = {"lengths": ("seqlens_q", "seqlens_kv")}.get(row["kind"], (row["name"],))
        gone += ("grad_sinks",) if row["name"] == "sinks" else ()
        assert key(op, {name: x for name, x in args.items() if name not in gone}) != base
        return
    if row["kind"] == "stats":
        b, h, s = shape
        strides = (h * s + 4, s, 1)  # padded between batches
    else:
        b, h, s, d = shape
        strides = (s * h * d, d, h * d, 1)  # bshd memory order
    args[row["name"]] = make(row, strides=strides)
    assert key(op, args) != base


FP8_ROWS = [row for row in TABLE if row["kind"] == "fp8_scale"]


@pytest.mark.parametrize("row", FP8_ROWS, ids=lambda row: row["name"])
def test_fp8_rows_are_reserved(row):
    # A row of the table is all it takes for intake to read the operand by name and the validator to
    # answer for it; until FP8 attention gives these their graph lines, the answer is a refusal.
    scale = FakeTensor((1,), None, "float32", data=0x7E0000000000)
    for op in OPS:
        args = dict(call_args(op), **{row["name"]: scale})
        if row[op] is None:
            with pytest.raises(TypeError, match=f"has no operand {row['name']}"):
                validate(op, args)
            continue
        assert row[f"{op}_optional"]
        with pytest.raises(stridedfa.UnsupportedError, match=rf"^{row['name']} is an FP8 attention operand"):
            validate(op, args)


def test_fp8_rows_name_cudnns_scaling_operands():
    names = {row["name"] for row in FP8_ROWS}
    assert {"descale_q", "descale_k", "descale_v", "scale_s", "scale_out", "amax_s", "amax_out"} <= names
    assert {"descale_out", "descale_grad_out", "descale_dp", "scale_dp", "amax_dp"} <= names
    assert {f"{kind}_grad_{x}" for kind in ("scale", "amax") for x in "qkv"} <= names
    assert all(row["forward_optional"] or row["forward"] is None for row in FP8_ROWS)
