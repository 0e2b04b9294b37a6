#include "stridedfa/tensor_view.hpp"

#include "stridedfa/errors.hpp"

namespace stridedfa {

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

TensorView view_from_dltensor(const DLTensor& tensor, bool read_only, const char* name) {
  if (tensor.ndim < 0 || tensor.ndim > kMaxDims) {
    throw LayoutError(std::string(name) + ": DLPack reports " + std::to_string(tensor.ndim) +
                      " axes; stridedfa reads at most " + std::to_string(kMaxDims));
  }
  TensorView view;
  view.name = name;
  view.present = true;
  view.ndim = tensor.ndim;
  view.dtype = tensor.dtype;
  view.device_type = static_cast<int32_t>(tensor.device.device_type);
  view.device_id = tensor.device.device_id;
  view.data = reinterpret_cast<std::uintptr_t>(tensor.data) + tensor.byte_offset;
  view.read_only = read_only;
  int64_t row_major = 1;
  for (int i = tensor.ndim - 1; i >= 0; --i) {
    view.dims[i] = tensor.shape[i];
    view.strides[i] = tensor.strides ? tensor.strides[i] : row_major;
    row_major *= tensor.shape[i];
  }
  return view;
}

std::string dtype_name(DLDataType dtype) {
  std::string base;
  switch (dtype.code) {
    case kDLInt: base = "int"; break;
    case kDLUInt: base = "uint"; break;
    case kDLFloat: base = "float"; break;
    case kDLBfloat: base = "bfloat"; break;
    case kDLComplex: base = "complex"; break;
    case kDLBool: return "bool";
    default: base = "dlpack_code" + std::to_string(dtype.code) + "_"; break;
  }
  std::string name = base + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

std::string device_type_name(int32_t device_type) {
  switch (device_type) {
    case kDLCPU: return "CPU";
    case kDLCUDA: return "CUDA";
    case kDLCUDAHost: return "CUDA host (pinned) memory";
    case kDLCUDAManaged: return "CUDA managed memory";
    case kDLROCM: return "ROCm";
    case kDLROCMHost: return "ROCm host memory";
    case kDLMetal: return "Metal";
    case kDLOneAPI: return "oneAPI";
    case kDLVulkan: return "Vulkan";
    default: return "DLPack device type " + std::to_string(device_type);
  }
}

}  // namespace stridedfa
