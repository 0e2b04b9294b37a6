#include "stridedfa/cuda_driver.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "stridedfa/errors.hpp"

namespace stridedfa {

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      failure = std::string("cannot open the CUDA driver libcuda.so.1: ") + (dlerror() ? dlerror() : "");
      return;
    }
    auto find = [&](auto& entry, const char* name) {
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(lib, name));
      if (!entry && failure.empty()) failure = std::string("libcuda.so.1 lacks ") + name;
    };
    find(d.memset16, "cuMemsetD2D16Async");
    find(d.memset32, "cuMemsetD2D32Async");
    find(d.memcpy2d, "cuMemcpy2DAsync_v2");
    find(d.module_load_data, "cuModuleLoadData");
    find(d.module_get_function, "cuModuleGetFunction");
    find(d.launch_kernel, "cuLaunchKernel");
    find(d.memcpy_dtoh, "cuMemcpyDtoHAsync_v2");
    find(d.stream_synchronize, "cuStreamSynchronize");
    find(d.stream_is_capturing, "cuStreamIsCapturing");
  });
  if (!failure.empty()) throw BackendError(failure);
  return d;
}

void check_driver(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS)
    throw BackendError(std::string(what) + " failed (CUDA driver error " + std::to_string(int(status)) + ")");
}

}  // namespace stridedfa
