// Tensor views for the core's tests: made by hand, as intake would make them from DLPack, at
// made-up device addresses (nothing here touches memory).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "stridedfa/layout_rules.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa::testing {

inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};
inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};
inline constexpr DLDataType kI64{kDLInt, 64, 1};

// A CUDA tensor of `dims` at `address`: row-major unless `strides` are given.
inline TensorView view(const char* name, std::initializer_list<int64_t> dims, DLDataType dtype = kBF16,
                       std::uintptr_t address = 0x7f0000000000, std::initializer_list<int64_t> strides = {}) {
  TensorView t;
  t.name = name;
  t.present = true;
  t.ndim = static_cast<int32_t>(dims.size());
  int i = 0;
  for (int64_t d : dims) t.dims[i++] = d;
  if (strides.size() == dims.size()) {
    i = 0;
    for (int64_t s : strides) t.strides[i++] = s;
  } else {
    int64_t stride = 1;
    for (int axis = t.ndim - 1; axis >= 0; --axis) {
      t.strides[axis] = stride;
      stride *= t.dims[axis];
    }
  }
  t.dtype = dtype;
  t.device_type = kDLCUDA;
  t.data = address;
  return t;
}

// (b, h, s, d) logical axes over bshd memory (seq outer to heads), as a transposed torch tensor is.
inline TensorView bshd(const char* name, int64_t b, int64_t h, int64_t s, int64_t d, std::uintptr_t address,
                       DLDataType dtype = kBF16) {
  return view(name, {b, h, s, d}, dtype, address, {s * h * d, d, h * d, 1});
}

}  // namespace stridedfa::testing
