// Stream-ordered fills and copies of strided device regions, for what the mask leaves out of
// cuDNN's graph (visibility.hpp): the CUDA driver's 2-D memset and memcpy, one call per 2-D plane
// of the region (usually one or a handful). Capturable into CUDA graphs. Driver calls: the
// device's context must be current on the calling thread (runtime.hpp bind_device_context).
#pragma once

#include <cstdint>

#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// Sets every element of `region` (2- or 4-byte items) to the low itemsize bytes of `pattern`, on
// `stream` of the current device. Throws BackendError.
void fill_strided(const TensorView& region, uint32_t pattern, std::uintptr_t stream);

// `t`'s dims and dtype, packed (row-major in its logical axis order) at `data`.
TensorView packed_like(const TensorView& t, std::uintptr_t data);

// Copies `src` into `dst` laid out packed in src's logical axis order, on `stream`.
void copy_to_packed(const TensorView& src, void* dst, std::uintptr_t stream);

// Copies `src` into `dst`: same dims and dtype, each with its own strides, on `stream`.
void copy_strided(const TensorView& src, const TensorView& dst, std::uintptr_t stream);

}  // namespace stridedfa
