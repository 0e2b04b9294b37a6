// The layouts stridedfa allocates and the views it cuts, as rules on shapes and strides (in
// elements). Every adapter's allocation follows them: an output is dense in an input's axis order,
// a gradient has its input's strides when that input is dense (else dense in its axis order), and
// the packed entry point's q/k/v are slices of one buffer. stridedfa/_layouts.py is the symbolic
// twin that fake tensors use under torch.compile; tests/test_layout_rules.py keeps the two equal.
#pragma once

#include <cstdint>

#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// Dense strides for `shape` with the axes in the memory order of `like_strides` (outermost first,
// ties in logical order); extent-1 axes go outermost whatever their strides (producers export
// arbitrary strides there, so those must not decide what is allocated).
void dense_strides_like(const int64_t* shape, const int64_t* like_strides, int ndim, int64_t* strides);

// Whether the layout covers exactly prod(shape) contiguous elements, in any axis order.
bool is_dense(const int64_t* shape, const int64_t* strides, int ndim);

// The strides of the gradient of `like`: like's own when dense, else dense in its axis order.
void gradient_strides(const TensorView& like, int64_t* strides);

// packed.select(dim, index): a 4-axis view of a 5-axis packed buffer whose remaining axes are in
// layout order, permuted to the core's (b, h, s, d) axes by to_logical (to_logical[i] is the layout
// axis holding core axis i; nullptr keeps layout order). No memory is touched.
TensorView select_packed(const TensorView& packed, int dim, int index, const int* to_logical, const char* name);

// A 4-axis view in layout order, permuted to the core's (b, h, s, d) axes.
TensorView to_core_axes(const TensorView& layout_view, const int* to_logical, const char* name);

// What stridedfa allocates for an output of a call whose inputs are read: every allocating entry
// point (the framework's allocator, CuPy's pool, DeviceBuffers) asks this one rule.
//   out: dense in q's axis order (a variable-length call's (tokens, heads, head_dim): contiguous);
//   lse: packed float32 (batch, heads, seq), the layout every cuDNN backward reads; a
//        variable-length call's (heads, tokens) over token-major memory;
//   grad_q, grad_k, grad_v: gradient_strides of their input (a variable-length call's: contiguous,
//        token-major, the only gradients into which cuDNN sums grouped heads);
//   grad_sinks: float32 (heads of q,); grad_bias: contiguous, bias' shape and dtype.
// ndim 0 where the slot is none of these, or the inputs it derives from are missing or of another
// rank than the call's layout has (the validator names that problem).
struct OutputLayout {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  DLDataType dtype{};
};
OutputLayout output_layout(const CallOperands& call, int slot);

// Row-major strides of `shape`, an extent-1 axis taking the next one's stride.
void contiguous_strides(const int64_t* shape, int ndim, int64_t* strides);

}  // namespace stridedfa
