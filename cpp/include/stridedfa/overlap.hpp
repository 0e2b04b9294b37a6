// Exact memory-overlap tests for strided tensors. Packed q/k/v views and packed gradient buffers
// have intersecting address ranges but disjoint elements, so a bounding-box test would refuse
// valid calls; these answer the real question: does any byte belong to both?
#pragma once

#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

enum class Overlap {
  none,      // proven disjoint
  overlaps,  // a shared byte exists
  unknown,   // the search gave up (pathological strides); callers treat it as an overlap
};

// Do any bytes of a and b coincide?
Overlap memory_overlap(const TensorView& a, const TensorView& b);

// Do two distinct elements of t share a byte (a broadcast or otherwise self-aliasing view)?
Overlap internal_overlap(const TensorView& t);

}  // namespace stridedfa
