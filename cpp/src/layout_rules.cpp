#include "stridedfa/layout_rules.hpp"

namespace stridedfa {
namespace {

// Memory order, outermost first: a before b when a is outer; extent-1 axes outermost.
bool axis_is_outer(const int64_t* shape, const int64_t* strides, int a, int b) {
  if (shape[a] == 1 || shape[b] == 1) return shape[a] == 1 && shape[b] != 1;
  return strides[a] > strides[b];
}

}  // namespace

void dense_strides_like(const int64_t* shape, const int64_t* like_strides, int ndim, int64_t* strides) {
  int order[kMaxDims];
  for (int i = 0; i < ndim; ++i) order[i] = i;
  for (int i = 1; i < ndim; ++i) {  // stable insertion sort
    const int axis = order[i];
    int j = i - 1;
    while (j >= 0 && axis_is_outer(shape, like_strides, axis, order[j])) {
      order[j + 1] = order[j];
      --j;
    }
    order[j + 1] = axis;
  }
  int64_t step = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    strides[order[i]] = step;
    step *= shape[order[i]] > 0 ? shape[order[i]] : 1;
  }
}

bool is_dense(const int64_t* shape, const int64_t* strides, int ndim) {
  int order[kMaxDims];
  for (int i = 0; i < ndim; ++i) order[i] = i;
  for (int i = 1; i < ndim; ++i) {  // by increasing stride, stable
    const int axis = order[i];
    int j = i - 1;
    while (j >= 0 && strides[order[j]] > strides[axis]) {
      order[j + 1] = order[j];
      --j;
    }
    order[j + 1] = axis;
  }
  int64_t expected = 1;
  for (int i = 0; i < ndim; ++i) {
    const int axis = order[i];
    if (shape[axis] == 1) continue;
    if (strides[axis] != expected) return false;
    expected *= shape[axis];
  }
  return true;
}

void gradient_strides(const TensorView& like, int64_t* strides) {
  if (is_dense(like.dims, like.strides, like.ndim)) {
    for (int i = 0; i < like.ndim; ++i) strides[i] = like.strides[i];
  } else {
    dense_strides_like(like.dims, like.strides, like.ndim, strides);
  }
}

TensorView select_packed(const TensorView& packed, int dim, int index, const int* to_logical, const char* name) {
  int remaining[4];
  int n = 0;
  for (int i = 0; i < 5; ++i) {
    if (i != dim) remaining[n++] = i;
  }
  TensorView out = packed;
  out.name = name;
  out.ndim = 4;
  for (int i = 0; i < 4; ++i) {
    const int axis = remaining[to_logical ? to_logical[i] : i];
    out.dims[i] = packed.dims[axis];
    out.strides[i] = packed.strides[axis];
    out.caller_axes[i] = packed.caller_axes[axis];
  }
  out.data = packed.data + std::uintptr_t(index * packed.strides[dim] * packed.itemsize());
  return out;
}

TensorView to_core_axes(const TensorView& layout_view, const int* to_logical, const char* name) {
  TensorView out = layout_view;
  out.name = name;
  for (int i = 0; i < 4; ++i) {
    out.dims[i] = layout_view.dims[to_logical[i]];
    out.strides[i] = layout_view.strides[to_logical[i]];
    out.caller_axes[i] = layout_view.caller_axes[to_logical[i]];
  }
  return out;
}

void contiguous_strides(const int64_t* shape, int ndim, int64_t* strides) {
  int64_t inner = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    strides[i] = inner;
    inner *= shape[i] > 1 ? shape[i] : 1;
  }
}

OutputLayout output_layout(const CallOperands& call, int slot) {
  OutputLayout out;
  const TensorView& q = call.slot[kQ];
  const TensorView& v = call.slot[kV];
  const bool ragged = call.slot[kCuSeqlensQ].present;
  const int rank = ragged ? 3 : 4;  // (tokens, heads, head_dim) or (batch, heads, seq, head_dim)
  if (!q.present || q.ndim != rank) return out;
  constexpr DLDataType kFloat32{kDLFloat, 32, 1};
  switch (slot) {
    case kO:
      if (!v.present || v.ndim != rank) return out;
      out.ndim = rank;
      for (int i = 0; i < rank - 1; ++i) out.shape[i] = q.dims[i];
      out.shape[rank - 1] = v.dims[rank - 1];
      if (ragged) {
        contiguous_strides(out.shape, rank, out.strides);
      } else {
        dense_strides_like(out.shape, q.strides, rank, out.strides);
      }
      out.dtype = q.dtype;
      return out;
    case kLse:
      out.dtype = kFloat32;
      if (ragged) {  // (heads, tokens) over (tokens, heads) memory
        out.ndim = 2;
        out.shape[0] = q.dims[1];
        out.shape[1] = q.dims[0];
        out.strides[0] = 1;
        out.strides[1] = q.dims[1];
        return out;
      }
      out.ndim = 3;
      for (int i = 0; i < 3; ++i) out.shape[i] = q.dims[i];
      out.strides[2] = 1;  // packed whatever the extents: cuDNN before 9.26 ignores the strides
      out.strides[1] = q.dims[2];
      out.strides[0] = q.dims[1] * q.dims[2];
      return out;
    case kGradQ:
    case kGradK:
    case kGradV: {
      const TensorView& input = call.slot[slot == kGradQ ? kQ : slot == kGradK ? kK : kV];
      if (!input.present || input.ndim != rank) return OutputLayout{};
      out.ndim = rank;
      for (int i = 0; i < rank; ++i) out.shape[i] = input.dims[i];
      if (ragged) {  // token-major whatever the input's strides: cuDNN sums grouped heads only into those
        contiguous_strides(out.shape, rank, out.strides);
      } else {
        gradient_strides(input, out.strides);
      }
      out.dtype = input.dtype;
      return out;
    }
    case kGradSinks:
      out.ndim = 1;
      out.shape[0] = q.dims[1];
      out.strides[0] = 1;
      out.dtype = kFloat32;
      return out;
    case kGradBias: {
      const TensorView& bias = call.slot[kBias];
      if (!bias.present || bias.ndim < 1 || bias.ndim > 4) return out;
      out.ndim = bias.ndim;
      for (int i = 0; i < bias.ndim; ++i) out.shape[i] = bias.dims[i];
      contiguous_strides(out.shape, out.ndim, out.strides);
      out.dtype = bias.dtype;
      return out;
    }
    default:
      return out;
  }
}

}  // namespace stridedfa
