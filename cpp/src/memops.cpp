#include "stridedfa/memops.hpp"

#include <algorithm>
#include <string>

#include "stridedfa/cuda_driver.hpp"
#include "stridedfa/errors.hpp"

namespace stridedfa {
namespace {

// A region as rows of `width` contiguous items, `height` rows `pitch` items apart, repeated at
// the offsets of the remaining axes (`outer`, innermost last).
struct Planes {
  int64_t width = 1, height = 1, pitch = 1;
  int n_outer = 0;
  int64_t outer_dims[kMaxDims] = {}, outer_strides[kMaxDims] = {};
};

Planes planes_of(const TensorView& t) {
  int axes[kMaxDims];
  int n = 0;
  for (int i = 0; i < t.ndim && i < kMaxDims; ++i) {
    if (t.dims[i] != 1) axes[n++] = i;
  }
  std::sort(axes, axes + n, [&](int a, int b) { return t.strides[a] < t.strides[b]; });
  Planes p;
  int next = 0;
  if (n > 0 && t.strides[axes[0]] == 1) {  // merge the contiguous innermost axes into one row
    p.width = t.dims[axes[0]];
    next = 1;
    while (next < n && t.strides[axes[next]] == p.width) p.width *= t.dims[axes[next++]];
  }
  if (next < n) {
    p.height = t.dims[axes[next]];
    p.pitch = t.strides[axes[next]];
    ++next;
  } else {
    p.pitch = p.width;
  }
  for (int i = n - 1; i >= next; --i) {
    p.outer_dims[p.n_outer] = t.dims[axes[i]];
    p.outer_strides[p.n_outer++] = t.strides[axes[i]];
  }
  return p;
}

// Calls fn(element offset of the plane) for every plane.
template <class Fn>
void for_each_plane(const Planes& p, Fn&& fn) {
  int64_t index[kMaxDims] = {};
  while (true) {
    int64_t offset = 0;
    for (int i = 0; i < p.n_outer; ++i) offset += index[i] * p.outer_strides[i];
    fn(offset);
    int i = p.n_outer - 1;
    for (; i >= 0; --i) {
      if (++index[i] < p.outer_dims[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace

void fill_strided(const TensorView& region, uint32_t pattern, std::uintptr_t stream) {
  if (region.numel() == 0) return;
  const Driver& d = driver();
  const int64_t item = region.itemsize();
  if (item != 2 && item != 4) throw BackendError("fill_strided: items must be 2 or 4 bytes");
  const Planes p = planes_of(region);
  const auto s = reinterpret_cast<CUstream>(stream);
  for_each_plane(p, [&](int64_t offset) {
    const CUdeviceptr ptr = CUdeviceptr(region.data + std::uintptr_t(offset * item));
    const size_t pitch = size_t(p.pitch * item), width = size_t(p.width), height = size_t(p.height);
    if (item == 2) {
      check_driver(d.memset16(ptr, pitch, static_cast<unsigned short>(pattern), width, height, s),
                   "cuMemsetD2D16Async");
    } else {
      check_driver(d.memset32(ptr, pitch, pattern, width, height, s), "cuMemsetD2D32Async");
    }
  });
}

TensorView packed_like(const TensorView& t, std::uintptr_t data) {
  TensorView packed = t;
  int64_t step = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    packed.strides[i] = step;
    step *= t.dims[i];
  }
  packed.data = data;
  return packed;
}

void copy_to_packed(const TensorView& src, void* dst, std::uintptr_t stream) {
  copy_strided(src, packed_like(src, reinterpret_cast<std::uintptr_t>(dst)), stream);
}

void copy_strided(const TensorView& src, const TensorView& dst, std::uintptr_t stream) {
  if (src.numel() == 0) return;
  const Driver& d = driver();
  const int64_t item = src.itemsize();
  // Rows along the innermost logical axis with extent > 1 (one 2-D copy each, with both pitches),
  // looping over the other axes.
  int inner = -1;
  for (int i = src.ndim - 1; i >= 0 && inner < 0; --i) {
    if (src.dims[i] != 1) inner = i;
  }
  int64_t index[kMaxDims] = {};
  while (true) {
    int64_t from = 0, to = 0;
    for (int i = 0; i < src.ndim; ++i) {
      if (i == inner) continue;
      from += index[i] * src.strides[i];
      to += index[i] * dst.strides[i];
    }
    const int64_t rows = inner < 0 ? 1 : src.dims[inner];
    CUDA_MEMCPY2D copy = {};
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = CUdeviceptr(src.data + std::uintptr_t(from * item));
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = CUdeviceptr(dst.data + std::uintptr_t(to * item));
    const int64_t src_step = inner < 0 ? 1 : src.strides[inner], dst_step = inner < 0 ? 1 : dst.strides[inner];
    if (src_step == 1 && dst_step == 1) {  // contiguous in both: one flat row
      copy.WidthInBytes = size_t(rows * item);
      copy.Height = 1;
      copy.srcPitch = copy.dstPitch = copy.WidthInBytes;
    } else {  // one element per row
      copy.WidthInBytes = size_t(item);
      copy.Height = size_t(rows);
      copy.srcPitch = size_t(src_step * item);
      copy.dstPitch = size_t(dst_step * item);
    }
    check_driver(d.memcpy2d(&copy, reinterpret_cast<CUstream>(stream)), "cuMemcpy2DAsync");
    int i = src.ndim - 1;
    for (; i >= 0; --i) {
      if (i == inner) continue;
      if (++index[i] < src.dims[i]) break;
      index[i] = 0;
    }
    if (i < 0) return;
  }
}

}  // namespace stridedfa
