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
  // The caller's number for each axis, for messages: a JAX bshd array's heads are its axis 2, a
  // packed buffer's slices keep the buffer's axis numbers. Identity for a tensor read as given.
  int8_t caller_axes[kMaxDims] = {0, 1, 2, 3, 4, 5, 6, 7};

  int64_t numel() const;
  int64_t itemsize() const { return (int64_t(dtype.bits) * dtype.lanes + 7) / 8; }
};

// Highest byte address a tensor may reach. No platform CUDA runs on maps memory above it
// (x86-64 user space ends at 2^47, or 2^56 with 5-level paging; AArch64 at 2^52), so a layout
// that reaches further cannot describe real memory: its producer computed a stride wrongly.
inline constexpr uint64_t kAddressLimit = uint64_t(1) << 57;

// Known defects of producers' DLPack exports that intake repairs.
enum class ExportQuirk : int32_t {
  none = 0,
  // CuPy (seen in 14.2, cupy/_core/dlpack.pyx toDlpack) exports each stride as the signed byte
  // stride divided by a size_t itemsize, an unsigned division: -128 bytes of float16 arrive as
  // (2^64 - 128) / 2 = 2^63 - 64 elements. Multiplying back by the itemsize modulo 2^64 restores
  // the byte stride exactly; only values whose byte stride would not fit in int64 are touched.
  cupy_unsigned_strides = 1,
};

// Normalises a DLTensor: NULL strides become row-major, byte_offset is folded into data, `quirk`
// repaired. Throws LayoutError when ndim is negative or exceeds kMaxDims, an extent is negative,
// data + byte_offset wraps, or the layout is not addressable (check_addressable).
TensorView view_from_dltensor(const DLTensor& tensor, bool read_only, const char* name,
                              ExportQuirk quirk = ExportQuirk::none);

// Refuses (LayoutError naming the tensor and axis) a layout no memory can hold: negative extents,
// more elements than int64 counts, or bytes reached below address 0 or above kAddressLimit. Empty
// tensors pass whatever their strides (DLPack leaves them arbitrary). Exact: 128-bit arithmetic.
void check_addressable(const TensorView& t);

// Elements from t's data pointer to its last element, plus one (t non-empty, strides >= 0).
int64_t element_extent(const TensorView& t);

// "float16", "bfloat16", "float32", "int8", ... for messages.
std::string dtype_name(DLDataType dtype);
// "CPU", "CUDA", "CUDA host (pinned)", ... for messages.
std::string device_type_name(int32_t device_type);

}  // namespace stridedfa
