// Stream-ordered fills and copies of strided device regions, for what the mask leaves out of
// cuDNN's graph (visibility.hpp): the CUDA driver's 2-D memset and memcpy, one call per 2-D block
// of the region (blocks_of: usually one). Capturable into CUDA graphs. Driver calls: the
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

// A copy from `src` to `dst` (a fill: the same view twice) as the driver's 2-D blocks: rows of
// `width` contiguous items, `height` rows, each side's rows its own pitch apart, repeated at the
// offsets of the remaining axes. Axes merge wherever both sides allow (contiguous into the width,
// evenly strided into the height), so that a row-cut output -- (b, h, rows) of statistics, say --
// takes one call rather than one per (b, h). Offsets and pitches in items.
struct Blocks2D {
  int64_t width = 1, height = 1, src_pitch = 1, dst_pitch = 1;
  int n_outer = 0;  // the looped axes, innermost last
  int64_t outer_dims[kMaxDims] = {}, src_outer[kMaxDims] = {}, dst_outer[kMaxDims] = {};
  int64_t count() const;  // the blocks, one driver call each
};
Blocks2D blocks_of(const TensorView& src, const TensorView& dst);

// Calls fn(src offset, dst offset) for every block of `b`.
template <class Fn>
void for_each_block(const Blocks2D& b, Fn&& fn) {
  int64_t index[kMaxDims] = {};
  while (true) {
    int64_t from = 0, to = 0;
    for (int i = 0; i < b.n_outer; ++i) {
      from += index[i] * b.src_outer[i];
      to += index[i] * b.dst_outer[i];
    }
    fn(from, to);
    int i = b.n_outer - 1;
    for (; i >= 0; --i) {
      if (++index[i] < b.outer_dims[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace stridedfa
