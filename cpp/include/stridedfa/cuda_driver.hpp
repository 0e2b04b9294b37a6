// The CUDA driver entry points the core calls itself, from the libcuda.so.1 the CUDA runtime runs
// on (dlopen'ed once, so that the extension links no driver library): 2-D memsets and copies
// (memops.hpp) and the one kernel stridedfa launches (ragged.hpp), which ships as PTX and is
// compiled by the driver for whatever GPU it meets. Driver calls need the device's context
// current on the calling thread (runtime.hpp bind_device_context).
#pragma once

#include <cuda.h>

namespace stridedfa {

struct Driver {
  decltype(&::cuMemsetD2D16Async) memset16 = nullptr;
  decltype(&::cuMemsetD2D32Async) memset32 = nullptr;
  decltype(&::cuMemcpy2DAsync_v2) memcpy2d = nullptr;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuLaunchKernel) launch_kernel = nullptr;
  // The opt-in bounds check's read-back (bounds_check.hpp)
  decltype(&::cuMemcpyDtoHAsync_v2) memcpy_dtoh = nullptr;
  decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
  decltype(&::cuStreamIsCapturing) stream_is_capturing = nullptr;
};

// Throws BackendError when libcuda.so.1 or one of the entry points is missing.
const Driver& driver();

// Throws BackendError naming `what` unless status is CUDA_SUCCESS.
void check_driver(CUresult status, const char* what);

}  // namespace stridedfa
