// The kinds of failure the core reports. The Cython boundary maps each to the Python exception of
// the same name (stridedfa.LayoutError, BoundsError, UnsupportedError, BackendError) in one place
// (_core.pyx: raise_current_error); nothing else crosses the boundary.
#pragma once

#include <stdexcept>
#include <string>

namespace stridedfa {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The caller's tensors cannot be used as given: device, dtype, shape, stride, alignment, aliasing.
struct LayoutError : Error {
  using Error::Error;
};

// Lengths, offsets or block ids on the device that lie outside the tensors they index, found by
// the opt-in bounds check (bounds_check.hpp) instead of being clamped.
struct BoundsError : LayoutError {
  using LayoutError::LayoutError;
};

// The tensors are well formed but cuDNN (or stridedfa) cannot run this configuration.
struct UnsupportedError : Error {
  using Error::Error;
};

// cuDNN or the CUDA runtime is missing or failed.
struct BackendError : Error {
  using Error::Error;
};

enum class ErrorKind : int { none = 0, layout = 1, unsupported = 2, backend = 3, other = 4, bounds = 5 };

// Called inside a catch block: classifies the in-flight exception and copies its message.
ErrorKind classify_current_exception(std::string& message) noexcept;

}  // namespace stridedfa
