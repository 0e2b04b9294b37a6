// Process-wide runtime state: the loaded cuDNN and CUDA runtime libraries, per-device facts, one
// cuDNN handle per (device, thread), and stridedfa's stream-ordered memory pools. Nothing here is linked:
// libcudnn.so.9 and libcudart.so.N are found by stridedfa._loader and opened with dlopen, so the
// extension imports on machines without a GPU, a driver or cuDNN.
#pragma once

#include <cstdint>
#include <string>

namespace stridedfa {

// Hands the core the libraries the Python loader found: a dlopen handle of libcudnn.so.9 and the
// path of the CUDA runtime. Also points cudnn-frontend at both. Throws BackendError.
void set_libraries(void* cudnn_dl_handle, const std::string& cudart_path);
bool libraries_loaded();

// Versions as integers (cuDNN 9.19.0 -> 91900, CUDA 13.0 -> 13000). Throw BackendError.
int64_t cudnn_runtime_version();
int cuda_runtime_version();
int cuda_driver_version();
int device_count();

struct DeviceInfo {
  int32_t ordinal = 0;
  int32_t sm_version = 0;  // compute capability as major * 10 + minor
  int32_t sm_count = 0;    // streaming multiprocessors (a MIG slice or a smaller part has fewer)
  std::string name;
};
// Cached per ordinal; throws BackendError for a device the runtime cannot see.
const DeviceInfo& device_info(int32_t ordinal);

// Makes `ordinal` the current CUDA device for its lifetime, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The calling thread's cuDNN handle for `device` (current device must be `device`), bound to
// `stream`; cudnnSetStream costs microseconds even when nothing changes, so it runs only on change.
void* cudnn_handle_for(int32_t device, std::uintptr_t stream);

// Makes `device`'s primary context current on this thread, as driver-API calls need (the runtime
// binds it lazily: torch's autograd threads can run with the device set and no context current,
// where cuMemsetD2D*Async fails with CUDA_ERROR_INVALID_CONTEXT, GPU run 30).
void bind_device_context(int32_t device);

// Stream-ordered memory from stridedfa's own pool of `device` (the current device), which keeps up
// to STRIDEDFA_POOL_RETAIN_BYTES (default 512 MiB) of freed memory mapped across synchronisations.
// Workspaces of calls that pass none:
void* pool_alloc(int32_t device, int64_t bytes, std::uintptr_t stream);
void pool_free(void* ptr, std::uintptr_t stream);
// Gives every pool's unused memory back to the driver (cache_clear()).
void trim_pools();
struct PoolStats {
  int64_t reserved_bytes = 0;  // mapped by the pools, all devices
  int64_t used_bytes = 0;      // of which handed out now
  int64_t retain_bytes = 0;    // what each pool keeps across synchronisations at most
};
PoolStats pool_stats();

// Device memory of stridedfa-owned outputs (DeviceBuffer): `bytes` from `device`'s pool, ordered
// on `stream`. Throws BackendError.
void* buffer_alloc(int32_t device, int64_t bytes, std::uintptr_t stream);
// Returns a DeviceBuffer's memory. Stream-ordered on `stream` when only that stream ever used it;
// with `synchronize` (the memory was handed to consumers on other or unknown streams, whose work we
// cannot see) it first waits for all work on the device. Runs from DLPack deleters: never throws.
void buffer_free(int32_t device, void* ptr, std::uintptr_t stream, bool synchronize) noexcept;
// Orders all work queued so far on `producer` before any later work on `consumer` (an event
// recorded on one, waited on by the other). Throws BackendError.
void stream_wait_stream(int32_t device, std::uintptr_t consumer, std::uintptr_t producer);

}  // namespace stridedfa
