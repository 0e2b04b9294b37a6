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

}  // namespace stridedfa
