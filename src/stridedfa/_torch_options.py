"""The options the stridedfa torch operators take after their tensors, as immutable records read by
name: `Options` (dense, padded and packed operators) and `VarlenOptions` (THD operators).

Each record is declared once here and everything positional derives from it: the operators'
schema text (`schema`), where autograd reports an option's gradient (`position`), and which options
are tensors a kernel must see (`tensor_positions`). An operator receives its options as `*args`
(the dispatcher passes positional arguments); `Options.of(args)` makes the record without copying
fields. Records are NamedTuples, which torch.compile traces and the dispatcher unpacks as tuples.
Window bounds are two ints, -1 where unbounded (a schema int cannot be None); dropout's Philox
rng_state is drawn before the operator, so that the operator is a function of its inputs and the
backward regenerates the forward's mask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from torch import Tensor

# A field's annotation -> its type in an operator schema.
_SCHEMA_TYPES = {"float | None": "float?", "float": "float", "bool": "bool", "str": "str", "int": "int",
                 "Tensor | None": "Tensor?"}

# new_record(Record, fields): a record from its fields in order, without the NamedTuple's generated
# __new__ (a Python function of one argument per field: twice the host time of this).
new_record = tuple.__new__


class Options(NamedTuple):
    """What a dense, padded or packed attention call asks, beside its tensors."""

    scale: float | None
    causal: bool
    causal_alignment: str
    window_left: int
    window_right: int
    softcap: float | None
    seqlens_q: Tensor | None
    seqlens_kv: Tensor | None
    sinks: Tensor | None  # differentiable
    deterministic: bool
    bias: Tensor | None  # differentiable
    alibi_slopes: Tensor | None
    dropout_p: float
    rng_state: Tensor | None

    @classmethod
    def of(cls, args: tuple[Any, ...]) -> Options:
        """The record from an operator's positional arguments after its tensors (any flags after
        the options are left out)."""
        return new_record(cls, args[:len(cls._fields)])


class VarlenOptions(NamedTuple):
    """What a variable-length (THD) call asks, beside its tensors and cu_seqlens. max_seqlen_q/kv: 0
    bounded by the token count; deterministic is the backward's (the forward hands it on)."""

    max_seqlen_q: int
    max_seqlen_kv: int
    scale: float | None
    causal: bool
    causal_alignment: str
    window_left: int
    window_right: int
    softcap: float | None
    sinks: Tensor | None  # never trainable here
    dropout_p: float
    rng_state: Tensor | None
    deterministic: bool

    @classmethod
    def of(cls, args: tuple[Any, ...]) -> VarlenOptions:
        return new_record(cls, args[:len(cls._fields)])


def _schema_type(record: Any, name: str) -> str:
    annotation = record.__annotations__[name]  # a string, which NamedTuple wraps in a ForwardRef
    return _SCHEMA_TYPES[getattr(annotation, "__forward_arg__", annotation)]


def schema(record: Any) -> str:
    """The record's fields as an operator schema's arguments, in order."""
    return ", ".join(f"{_schema_type(record, name)} {name}" for name in record._fields)


def tensor_positions(record: Any) -> tuple[int, ...]:
    """The positions of the record's tensor fields (what an Autograd kernel must look at)."""
    return tuple(i for i, name in enumerate(record._fields) if _schema_type(record, name) == "Tensor?")


def position(record: Any, name: str) -> int:
    """Where field `name` sits among the options (autograd's needs_input_grad and the gradients a
    backward returns are positional)."""
    return record._fields.index(name)


def without_tensors(options: Options) -> Options:
    """The record with its tensor fields None: hashable by value (a cache key of what was asked)."""
    return options._replace(**_NO_TENSORS)


_NO_TENSORS: dict[str, Any] = {Options._fields[i]: None for i in tensor_positions(Options)}
