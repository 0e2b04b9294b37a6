// Each operand as cuDNN's four axes (batch, heads, seq, head_dim): what the caller gave -- a
// (b,) vector of lengths, (h,) per-head values, a (b, blocks) page table, a score bias of fewer
// axes, 3-axis statistics, THD tokens -- described as a 4-axis view of the same memory, with
// caller_axes saying which of the caller's axes each one is (for error messages). No copies.

#include "stridedfa/validate.hpp"
#include "stridedfa/validate_ragged.hpp"

namespace stridedfa {

TensorView stats_as_4d(const TensorView& lse) {
  TensorView t = lse;
  if (t.ndim == 3) {
    t.ndim = 4;
    t.dims[3] = 1;
    t.strides[3] = 1;
  }
  return t;
}

namespace {
// A vector (n,) as 4 axes with its values along `axis` and extent-1 axes the caller did not give
// elsewhere: padding lengths (b,) on the batch axis, per-head values (h,) on the heads', the Philox
// pair (2,) on the last.
TensorView vector_as_4d(const TensorView& vector, int axis) {
  TensorView t = vector;
  if (t.ndim != 1) return t;
  t.ndim = 4;
  for (int i = 0; i < 4; ++i) {
    t.dims[i] = 1;
    t.strides[i] = 1;
    t.caller_axes[i] = -1;
  }
  t.dims[axis] = vector.dims[0];
  t.strides[axis] = vector.strides[0];
  t.caller_axes[axis] = 0;
  return t;
}

// (s_kv,), (s_q, s_kv), (h, s_q, s_kv) -> 4 axes with leading axes of 1 (NumPy broadcasting);
// caller_axes -1 marks an axis the caller did not give.
TensorView scores_as_4d(const TensorView& scores) {
  TensorView t = scores;
  const int missing = 4 - scores.ndim;
  if (missing <= 0 || scores.ndim < 1) return t;
  t.ndim = 4;
  for (int axis = 3; axis >= 0; --axis) {
    const int from = axis - missing;
    t.dims[axis] = from >= 0 ? scores.dims[from] : 1;
    t.strides[axis] = from >= 0 ? scores.strides[from] : 0;
    t.caller_axes[axis] = static_cast<int8_t>(from >= 0 ? scores.caller_axes[from] : -1);
  }
  return t;
}

// A block table (b, blocks) as cuDNN's page table (b, 1, blocks, 1).
TensorView page_table_as_4d(const TensorView& table) {
  TensorView t = table;
  if (table.ndim != 2) return t;
  t.ndim = 4;
  const int64_t dims[4] = {table.dims[0], 1, table.dims[1], 1};
  const int64_t strides[4] = {table.strides[0], table.dims[1], table.strides[1], 1};
  const int8_t axes[4] = {0, -1, 1, -1};
  for (int i = 0; i < 4; ++i) {
    t.dims[i] = dims[i];
    t.strides[i] = strides[i];
    t.caller_axes[i] = axes[i];
  }
  return t;
}
}  // namespace

TensorView as_4d(const TensorView& t, OperandKind kind, bool ragged) {
  switch (kind) {
    case OperandKind::attention:
      return ragged && t.ndim == 3 ? thd_as_4d(t, false) : t;
    case OperandKind::stats:
      return ragged && t.ndim == 2 ? thd_as_4d(t, true) : stats_as_4d(t);
    case OperandKind::cumulative:
      return vector_as_4d(t, 3);
    case OperandKind::page_table:
      return page_table_as_4d(t);
    case OperandKind::lengths:
      return vector_as_4d(t, 0);
    case OperandKind::per_head:
      return vector_as_4d(t, 1);
    case OperandKind::scores:
      return scores_as_4d(t);
    case OperandKind::philox:
    case OperandKind::fp8_scale:
      return vector_as_4d(t, 3);
    default:
      return t;
  }
}

OperandViews::OperandViews(const CallOperands& call) {
  const bool ragged = is_ragged(call);
  for (int s = 0; s < kNumSlots; ++s) {
    if (!call.slot[s].present) continue;
    slots[s] = views.put(s, as_4d(call.slot[s], kOperands[s].kind, ragged));
  }
}

}  // namespace stridedfa
