#include "stridedfa/tensor_view.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "stridedfa/errors.hpp"

namespace stridedfa {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

namespace {

using wide = __int128;

std::string axis_of(const TensorView& t, int axis) { return std::string(t.name) + ": axis " + std::to_string(axis); }

// Producers hand over int64 strides; a defect upstream (see ExportQuirk) can make them huge.
int64_t repaired_stride(int64_t stride, int64_t itemsize, ExportQuirk quirk) {
  if (quirk != ExportQuirk::cupy_unsigned_strides || itemsize <= 1) return stride;
  const wide bytes = wide(stride) * itemsize;
  if (bytes <= INT64_MAX && bytes >= INT64_MIN) return stride;  // a correct export
  const auto byte_stride = static_cast<int64_t>(static_cast<uint64_t>(stride) * static_cast<uint64_t>(itemsize));
  return byte_stride / itemsize;
}

}  // namespace

TensorView view_from_dltensor(const DLTensor& tensor, bool read_only, const char* name, ExportQuirk quirk) {
  if (tensor.ndim < 0 || tensor.ndim > kMaxDims) {
    throw LayoutError(std::string(name) + ": DLPack reports " + std::to_string(tensor.ndim) +
                      " axes; stridedfa reads at most " + std::to_string(kMaxDims));
  }
  if (tensor.ndim > 0 && tensor.shape == nullptr) {
    throw LayoutError(std::string(name) + ": its producer exported no shape for " + std::to_string(tensor.ndim) +
                      " axes (a malformed DLPack tensor)");
  }
  TensorView view;
  view.name = name;
  view.present = true;
  view.ndim = tensor.ndim;
  view.dtype = tensor.dtype;
  view.device_type = static_cast<int32_t>(tensor.device.device_type);
  view.device_id = tensor.device.device_id;
  view.read_only = read_only;
  const auto base = reinterpret_cast<std::uintptr_t>(tensor.data);
  if (tensor.byte_offset > UINTPTR_MAX - base) {
    throw LayoutError(std::string(name) + ": data pointer " + std::to_string(base) + " plus byte_offset " +
                      std::to_string(tensor.byte_offset) +
                      " wraps around the 64-bit address space; its producer exported a malformed tensor");
  }
  view.data = base + tensor.byte_offset;
  const int64_t item = view.itemsize();
  wide row_major = 1;
  for (int i = tensor.ndim - 1; i >= 0; --i) {
    view.dims[i] = tensor.shape[i];
    if (view.dims[i] < 0) {
      throw LayoutError(axis_of(view, i) + " has extent " + std::to_string(view.dims[i]) +
                        "; extents cannot be negative (a malformed DLPack tensor)");
    }
    // Without strides, row-major; a stride too large for int64 can only belong to a tensor that is
    // empty (then it is never used) or refused below for its element count.
    view.strides[i] = tensor.strides ? repaired_stride(tensor.strides[i], item, quirk)
                                     : static_cast<int64_t>(std::min(row_major, wide(INT64_MAX)));
    row_major = std::min(row_major * (view.dims[i] > 0 ? view.dims[i] : 1), wide(INT64_MAX) + 1);
  }
  check_addressable(view);
  return view;
}

void check_addressable(const TensorView& t) {
  wide elements = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.dims[i] < 0) {
      throw LayoutError(axis_of(t, i) + " has extent " + std::to_string(t.dims[i]) + "; extents cannot be negative");
    }
    elements *= t.dims[i];
    if (elements > INT64_MAX) {
      throw LayoutError(std::string(t.name) + ": its extents multiply to more than 2^63 elements; no memory holds " +
                        "such a tensor (its producer exported a malformed shape)");
    }
  }
  if (elements == 0) return;
  const wide item = t.itemsize();
  const wide beyond = wide(1) << 64;  // any offset this large has left every address space
  // Lowest and highest byte offsets from data that the tensor's elements occupy; the axis that
  // moves furthest is the one to name.
  wide low = 0, high = item - 1, widest_span = -1;
  int widest = -1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.dims[i] == 1) continue;
    wide span = wide(t.strides[i]) * (t.dims[i] - 1);  // < 2^126 in magnitude
    const wide magnitude = span < 0 ? -span : span;
    span = magnitude > beyond ? (span < 0 ? -beyond : beyond) : span * item;  // clamped, stays far out
    if (span < 0)
      low += span;
    else
      high += span;
    if (magnitude > widest_span) {
      widest_span = magnitude;
      widest = i;
    }
  }
  const wide first = wide(t.data) + low, last = wide(t.data) + high;
  if (first >= 0 && last < wide(kAddressLimit)) return;
  std::string message = std::string(t.name) + ": its layout reaches memory " +
                        (first < 0 ? "below address 0" : "beyond 2^57, past the end of any 64-bit address space");
  if (widest >= 0) {
    message += " (axis " + std::to_string(widest) + " has stride " + std::to_string(t.strides[widest]) +
               " elements over extent " + std::to_string(t.dims[widest]) + ", " + std::to_string(int64_t(item)) +
               "-byte elements)";
  }
  throw LayoutError(message + ". No real tensor has this layout: its producer exported implausible strides " +
                    "or an implausible offset. Pass a tensor whose strides describe its memory (e.g. a copy).");
}

std::string dtype_name(DLDataType dtype) {
  std::string base;
  switch (dtype.code) {
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLComplex:
      base = "complex";
      break;
    case kDLBool:
      return "bool";
    default:
      base = "dlpack_code" + std::to_string(dtype.code) + "_";
      break;
  }
  std::string name = base + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

std::string device_type_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU:
      return "CPU";
    case kDLCUDA:
      return "CUDA";
    case kDLCUDAHost:
      return "CUDA host (pinned) memory";
    case kDLCUDAManaged:
      return "CUDA managed memory";
    case kDLROCM:
      return "ROCm";
    case kDLROCMHost:
      return "ROCm host memory";
    case kDLMetal:
      return "Metal";
    case kDLOneAPI:
      return "oneAPI";
    case kDLVulkan:
      return "Vulkan";
    default:
      return "DLPack device type " + std::to_string(device_type);
  }
}

int64_t element_extent(const TensorView& t) {
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.dims[i] - 1) * t.strides[i];
  return last + 1;
}

}  // namespace stridedfa
