#include "stridedfa/memops.hpp"

#include <algorithm>
#include <string>

#include "stridedfa/cuda_driver.hpp"
#include "stridedfa/errors.hpp"

namespace stridedfa {

int64_t Blocks2D::count() const {
  int64_t n = 1;
  for (int i = 0; i < n_outer; ++i) n *= outer_dims[i];
  return n;
}

Blocks2D blocks_of(const TensorView& src, const TensorView& dst) {
  int axes[kMaxDims];
  int n = 0;
  for (int i = 0; i < src.ndim && i < kMaxDims; ++i) {
    if (src.dims[i] != 1) axes[n++] = i;
  }
  std::sort(axes, axes + n, [&](int a, int b) {
    return src.strides[a] != src.strides[b] ? src.strides[a] < src.strides[b] : dst.strides[a] < dst.strides[b];
  });
  Blocks2D b;
  int next = 0;
  if (n > 0 && src.strides[axes[0]] == 1 && dst.strides[axes[0]] == 1) {  // contiguous on both sides
    b.width = src.dims[axes[0]];
    next = 1;
    while (next < n && src.strides[axes[next]] == b.width && dst.strides[axes[next]] == b.width)
      b.width *= src.dims[axes[next++]];
  }
  b.src_pitch = b.dst_pitch = b.width;
  // The rows' axis: the driver needs each pitch at least the width (no broadcast, no overlap).
  if (next < n && src.strides[axes[next]] >= b.width && dst.strides[axes[next]] >= b.width) {
    b.height = src.dims[axes[next]];
    b.src_pitch = src.strides[axes[next]];
    b.dst_pitch = dst.strides[axes[next]];
    ++next;
    while (next < n && src.strides[axes[next]] == b.height * b.src_pitch &&
           dst.strides[axes[next]] == b.height * b.dst_pitch)
      b.height *= src.dims[axes[next++]];
  }
  for (int i = n - 1; i >= next; --i) {
    b.outer_dims[b.n_outer] = src.dims[axes[i]];
    b.src_outer[b.n_outer] = src.strides[axes[i]];
    b.dst_outer[b.n_outer++] = dst.strides[axes[i]];
  }
  return b;
}

void fill_strided(const TensorView& region, uint32_t pattern, std::uintptr_t stream) {
  if (region.numel() == 0) return;
  const Driver& d = driver();
  const int64_t item = region.itemsize();
  if (item != 2 && item != 4) throw BackendError("fill_strided: items must be 2 or 4 bytes");
  const Blocks2D b = blocks_of(region, region);
  const auto s = reinterpret_cast<CUstream>(stream);
  for_each_block(b, [&](int64_t offset, int64_t) {
    const CUdeviceptr ptr = CUdeviceptr(region.data + std::uintptr_t(offset * item));
    const size_t pitch = size_t(b.dst_pitch * item), width = size_t(b.width), height = size_t(b.height);
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
  const Blocks2D b = blocks_of(src, dst);
  for_each_block(b, [&](int64_t from, int64_t to) {
    CUDA_MEMCPY2D copy = {};
    copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.srcDevice = CUdeviceptr(src.data + std::uintptr_t(from * item));
    copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy.dstDevice = CUdeviceptr(dst.data + std::uintptr_t(to * item));
    copy.WidthInBytes = size_t(b.width * item);
    copy.Height = size_t(b.height);
    copy.srcPitch = size_t(b.src_pitch * item);
    copy.dstPitch = size_t(b.dst_pitch * item);
    check_driver(d.memcpy2d(&copy, reinterpret_cast<CUstream>(stream)), "cuMemcpy2DAsync");
  });
}

}  // namespace stridedfa
