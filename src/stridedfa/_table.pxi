# Included by _core.pyx: the core's operand table (sdpa_types.hpp kOperands) as the boundary reads
# it: the operands' names, their rows for Python, and what validation established as a dict.

cdef const char* SLOT_NAMES[kNumSlots]  # the argument names, from the operand table
cdef int _slot
for _slot in range(<int>kNumSlots):
    SLOT_NAMES[_slot] = kOperands[_slot].name


cdef object role_name(Role role):
    return "input" if role == Role.input else "output" if role == Role.output else None


_EXTENTS = ("batch", "h_q", "h_kv", "s_q", "s_kv", "d_qk", "d_v", 1, 2, "batch+1", "blocks")
KIND_NAMES = ("attention", "stats", "lengths", "per_head", "scores", "philox", "cumulative", "page_table", "fp8_scale")


def _operands():
    """The core's operand table (cpp/include/stridedfa/sdpa_types.hpp, kOperands) in slot order:
    one dict per operand with its name, its role in the forward and the backward (None, "input" or
    "output"), whether each op may leave it out, its kind ("attention", "stats", "lengths",
    "per_head", "scores", "philox", "cumulative", "page_table" or "fp8_scale") and the logical
    extents of its (b, h, s, d) axes. Intake, validation, the cache key and the graph builder all walk this table."""
    cdef int slot, n = kNumSlots
    cdef const OperandInfo* info
    rows = []
    for slot in range(n):
        info = &kOperands[slot]
        rows.append({"slot": slot, "name": info.name.decode(), "forward": role_name(info.forward),
                     "backward": role_name(info.backward), "forward_optional": info.forward_optional,
                     "backward_optional": info.backward_optional, "kind": KIND_NAMES[<int>info.kind],
                     "shape": tuple(_EXTENTS[info.shape[axis]] for axis in range(4))})
    return rows


cdef void op_slots(bint backward, CallOperands* call, TensorView** views) noexcept:
    """Sets the call's op, and views[slot] to its operand of each slot the op has in the operand
    table (NULL where it has none)."""
    call.op = GraphOp.backward if backward else GraphOp.forward
    cdef int i
    cdef Role role
    for i in range(kNumSlots):
        role = kOperands[i].backward if backward else kOperands[i].forward
        views[i] = &call.slot[i]
        if role == Role.absent:
            views[i] = NULL


cdef dict problem_dict(Problem p):
    return {"b": p.b, "h_q": p.h_q, "h_kv": p.h_kv, "s_q": p.s_q, "s_kv": p.s_kv, "d_qk": p.d_qk,
            "d_v": p.d_v, "device": p.device, "dtype": dtype_name(p.dtype).decode(),
            "nothing_to_do": p.nothing_to_do, "sequences": p.sequences if p.ragged else None}
