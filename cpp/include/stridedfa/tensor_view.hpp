// A tensor as the core sees it: logical dims, element strides, dtype, device and the address of
// its first element. Built once from a DLTensor at intake; everything downstream (validation,
// cache keys, graph building, execution) reads only this.
#pragma once

#include <cstdint>
#include <string>

#include "stridedfa/dlpack.h"

namespace stridedfa {

inline constexpr int kMaxDims = 8;

struct TensorView {
  const char* name = "";  // the argument name used in error messages ("q", "grad_out", ...)
  bool present = false;   // false for an optional argument that was not given
  int32_t ndim = 0;
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements; row-major filled in when the producer gave NULL
  DLDataType dtype = {0, 0, 0};
  int32_t device_type = 0;  // DLDeviceType
  int32_t device_id = 0;
  std::uintptr_t data = 0;  // DLTensor::data + byte_offset: the address of element (0, ..., 0)
  bool read_only = false;   // DLPack READ_ONLY flag, or an immutable producer (JAX)

  int64_t numel() const;
  int64_t itemsize() const { return (int64_t(dtype.bits) * dtype.lanes + 7) / 8; }
};

// Normalises a DLTensor: NULL strides become row-major, byte_offset is folded into data.
// Throws LayoutError when ndim exceeds kMaxDims or is negative.
TensorView view_from_dltensor(const DLTensor& tensor, bool read_only, const char* name);

// "float16", "bfloat16", "float32", "int8", ... for messages.
std::string dtype_name(DLDataType dtype);
// "CPU", "CUDA", "CUDA host (pinned)", ... for messages.
std::string device_type_name(int32_t device_type);

}  // namespace stridedfa
