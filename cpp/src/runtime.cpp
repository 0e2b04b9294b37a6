#include "stridedfa/runtime.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "stridedfa/cudnn_graphs.hpp"
#include "stridedfa/errors.hpp"

namespace stridedfa {
namespace {

// The CUDA runtime and cuDNN functions the core calls itself, resolved once with dlsym.
struct Api {
  void* cudnn = nullptr;
  void* cudart = nullptr;
  std::string cudart_path;

  decltype(&cudaGetErrorString) GetErrorString = nullptr;
  decltype(&cudaRuntimeGetVersion) RuntimeGetVersion = nullptr;
  decltype(&cudaDriverGetVersion) DriverGetVersion = nullptr;
  decltype(&cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&cudaGetDevice) GetDevice = nullptr;
  decltype(&cudaSetDevice) SetDevice = nullptr;
  decltype(&cudaDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&cudaGetDeviceProperties) GetDeviceProperties = nullptr;
  decltype(&cudaFreeAsync) FreeAsync = nullptr;
  decltype(&cudaDeviceSynchronize) DeviceSynchronize = nullptr;
  decltype(&cudaEventCreateWithFlags) EventCreateWithFlags = nullptr;
  decltype(&cudaEventRecord) EventRecord = nullptr;
  decltype(&cudaStreamWaitEvent) StreamWaitEvent = nullptr;
  decltype(&cudaEventDestroy) EventDestroy = nullptr;
  decltype(&cudaMemPoolCreate) MemPoolCreate = nullptr;
  decltype(&cudaMemPoolSetAttribute) MemPoolSetAttribute = nullptr;
  decltype(&cudaMemPoolGetAttribute) MemPoolGetAttribute = nullptr;
  decltype(&cudaMemPoolTrimTo) MemPoolTrimTo = nullptr;
  decltype(&cudaMallocFromPoolAsync) MallocFromPoolAsync = nullptr;

  using CudnnStatus = int;
  size_t (*cudnnGetVersion)() = nullptr;
  int64_t cudnn_version = 0;
  const char* (*cudnnGetErrorString)(CudnnStatus) = nullptr;
  CudnnStatus (*cudnnCreate)(void**) = nullptr;
  CudnnStatus (*cudnnSetStream)(void*, cudaStream_t) = nullptr;
};

Api& api() {
  static Api* instance = new Api;  // never destroyed: handles may be used during interpreter exit
  return *instance;
}
std::atomic<bool> api_ready{false};  // set once, after every field of api() is filled

std::mutex& api_mutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}

template <class Fn>
void resolve(void* lib, const char* symbol, Fn& fn, const std::string& lib_name) {
  dlerror();
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (!fn) {
    const char* err = dlerror();
    throw BackendError("symbol " + std::string(symbol) + " not found in " + lib_name +
                       (err ? ": " + std::string(err) : ""));
  }
}

const Api& loaded_api() {
  const Api& a = api();
  if (!api_ready.load(std::memory_order_acquire)) {
    throw BackendError(
        "cuDNN and the CUDA runtime are not loaded yet (stridedfa loads them on first GPU use; see "
        "stridedfa.info() for what was found)");
  }
  return a;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    const Api& a = api();
    std::string text = a.GetErrorString ? a.GetErrorString(status) : "unknown error";
    throw BackendError(std::string(what) + " failed: " + text + " (CUDA error " + std::to_string(int(status)) + ")");
  }
}

// Handles outlive their threads in this free list instead of being destroyed: destroying a handle
// at thread or process exit races the CUDA runtime's own teardown.
struct HandlePool {
  std::mutex mutex;
  std::map<int32_t, std::vector<void*>> free_by_device;
};
HandlePool& handle_pool() {
  static HandlePool* pool = new HandlePool;
  return *pool;
}

struct ThreadHandles {
  struct Slot {
    void* handle = nullptr;
    std::uintptr_t stream = 0;
    bool stream_set = false;
  };
  std::vector<Slot> by_device;
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (size_t d = 0; d < by_device.size(); ++d) {
      if (by_device[d].handle) pool.free_by_device[int32_t(d)].push_back(by_device[d].handle);
    }
  }
};
thread_local ThreadHandles thread_handles;

}  // namespace

void set_libraries(void* cudnn_dl_handle, const std::string& cudart_path) {
  std::lock_guard<std::mutex> lock(api_mutex());
  Api& a = api();
  if (a.cudnn) return;  // first loader wins; the handles are process-wide
  if (!cudnn_dl_handle) throw BackendError("no cuDNN library handle was given");

  Api next;
  next.cudart_path = cudart_path;
  next.cudart = dlopen(cudart_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!next.cudart) {
    const char* err = dlerror();
    throw BackendError("cannot open the CUDA runtime " + cudart_path + (err ? ": " + std::string(err) : ""));
  }
  resolve(next.cudart, "cudaGetErrorString", next.GetErrorString, cudart_path);
  resolve(next.cudart, "cudaRuntimeGetVersion", next.RuntimeGetVersion, cudart_path);
  // The major is checked before any other symbol: the two majors export different ones, and a
  // missing-symbol message would hide the real problem.
  int runtime_version = 0;
  if (next.RuntimeGetVersion(&runtime_version) != cudaSuccess || runtime_version / 1000 != CUDART_VERSION / 1000) {
    dlclose(next.cudart);
    throw BackendError("this stridedfa (stridedfa-cu" + std::to_string(CUDART_VERSION / 1000) +
                       ") was built for CUDA " + std::to_string(CUDART_VERSION / 1000) + " but " + cudart_path +
                       " is CUDA runtime " + std::to_string(runtime_version / 1000) + "." +
                       std::to_string(runtime_version % 1000 / 10) + "; install stridedfa-cu" +
                       std::to_string(runtime_version / 1000) + " for that runtime, or the CUDA " +
                       std::to_string(CUDART_VERSION / 1000) + " runtime");
  }
  resolve(next.cudart, "cudaDriverGetVersion", next.DriverGetVersion, cudart_path);
  resolve(next.cudart, "cudaGetDeviceCount", next.GetDeviceCount, cudart_path);
  resolve(next.cudart, "cudaGetDevice", next.GetDevice, cudart_path);
  resolve(next.cudart, "cudaSetDevice", next.SetDevice, cudart_path);
  resolve(next.cudart, "cudaDeviceGetAttribute", next.DeviceGetAttribute, cudart_path);
  // CUDA 12 exported the current cudaDeviceProp layout as cudaGetDeviceProperties_v2; CUDA 13
  // exports it under the plain name.
  resolve(next.cudart, CUDART_VERSION >= 13000 ? "cudaGetDeviceProperties" : "cudaGetDeviceProperties_v2",
          next.GetDeviceProperties, cudart_path);
  resolve(next.cudart, "cudaFreeAsync", next.FreeAsync, cudart_path);
  resolve(next.cudart, "cudaDeviceSynchronize", next.DeviceSynchronize, cudart_path);
  resolve(next.cudart, "cudaEventCreateWithFlags", next.EventCreateWithFlags, cudart_path);
  resolve(next.cudart, "cudaEventRecord", next.EventRecord, cudart_path);
  resolve(next.cudart, "cudaStreamWaitEvent", next.StreamWaitEvent, cudart_path);
  resolve(next.cudart, "cudaEventDestroy", next.EventDestroy, cudart_path);
  resolve(next.cudart, "cudaMemPoolCreate", next.MemPoolCreate, cudart_path);
  resolve(next.cudart, "cudaMemPoolSetAttribute", next.MemPoolSetAttribute, cudart_path);
  resolve(next.cudart, "cudaMemPoolGetAttribute", next.MemPoolGetAttribute, cudart_path);
  resolve(next.cudart, "cudaMemPoolTrimTo", next.MemPoolTrimTo, cudart_path);
  resolve(next.cudart, "cudaMallocFromPoolAsync", next.MallocFromPoolAsync, cudart_path);

  const std::string cudnn_name = "libcudnn";
  resolve(cudnn_dl_handle, "cudnnGetVersion", next.cudnnGetVersion, cudnn_name);
  resolve(cudnn_dl_handle, "cudnnGetErrorString", next.cudnnGetErrorString, cudnn_name);
  resolve(cudnn_dl_handle, "cudnnCreate", next.cudnnCreate, cudnn_name);
  resolve(cudnn_dl_handle, "cudnnSetStream", next.cudnnSetStream, cudnn_name);
  const size_t cudnn_version = next.cudnnGetVersion();
  if (cudnn_version / 10000 != 9) {
    throw BackendError("stridedfa needs cuDNN 9; the loaded libcudnn reports version " + std::to_string(cudnn_version));
  }

  // cudnn-frontend resolves cuDNN symbols through its global handle and opens the CUDA runtime
  // by soname; point it at exactly the runtime found here unless the user chose one.
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart_path.c_str(), /*overwrite=*/0);
  set_frontend_cudnn_library(cudnn_dl_handle);
  next.cudnn = cudnn_dl_handle;
  next.cudnn_version = static_cast<int64_t>(cudnn_version);
  a = next;
  api_ready.store(true, std::memory_order_release);
}

bool libraries_loaded() { return api_ready.load(std::memory_order_acquire); }

int64_t cudnn_runtime_version() { return loaded_api().cudnn_version; }

int cuda_runtime_version() {
  int v = 0;
  check_cuda(loaded_api().RuntimeGetVersion(&v), "cudaRuntimeGetVersion");
  return v;
}

int cuda_driver_version() {
  int v = 0;
  check_cuda(loaded_api().DriverGetVersion(&v), "cudaDriverGetVersion");
  return v;
}

int device_count() {
  int n = 0;
  check_cuda(loaded_api().GetDeviceCount(&n), "cudaGetDeviceCount");
  return n;
}

const DeviceInfo& device_info(int32_t ordinal) {
  static std::mutex* mutex = new std::mutex;
  static auto* cache = new std::map<int32_t, std::unique_ptr<DeviceInfo>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return *it->second;

  const Api& a = loaded_api();
  const int n = device_count();
  if (ordinal < 0 || ordinal >= n) {
    throw BackendError("the tensors are on cuda:" + std::to_string(ordinal) + " but the CUDA runtime sees " +
                       std::to_string(n) + " device(s)");
  }
  auto info = std::make_unique<DeviceInfo>();
  info->ordinal = ordinal;
  int major = 0, minor = 0;
  check_cuda(a.DeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal), "cudaDeviceGetAttribute");
  check_cuda(a.DeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal), "cudaDeviceGetAttribute");
  info->sm_version = major * 10 + minor;
  cudaDeviceProp props{};
  check_cuda(a.GetDeviceProperties(&props, ordinal), "cudaGetDeviceProperties");
  info->name = props.name;
  info->sm_count = props.multiProcessorCount;
  return *cache->emplace(ordinal, std::move(info)).first->second;
}

DeviceGuard::DeviceGuard(int32_t ordinal) {
  const Api& a = loaded_api();
  int current = -1;
  check_cuda(a.GetDevice(&current), "cudaGetDevice");
  if (current != ordinal) {
    check_cuda(a.SetDevice(ordinal), "cudaSetDevice");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) api().SetDevice(previous_);
}

void bind_device_context(int32_t device) {
  // cudaSetDevice initialises the primary context and makes it current (CUDA >= 12), also when the
  // device is already the current one.
  check_cuda(loaded_api().SetDevice(device), "cudaSetDevice");
}

void* cudnn_handle_for(int32_t device, std::uintptr_t stream) {
  const Api& a = loaded_api();
  auto& slots = thread_handles.by_device;
  if (slots.size() <= size_t(device)) slots.resize(size_t(device) + 1);
  auto& slot = slots[size_t(device)];
  if (!slot.handle) {
    {
      HandlePool& pool = handle_pool();
      std::lock_guard<std::mutex> lock(pool.mutex);
      auto& free = pool.free_by_device[device];
      if (!free.empty()) {
        slot.handle = free.back();
        free.pop_back();
      }
    }
    if (!slot.handle) {
      int status = a.cudnnCreate(&slot.handle);
      if (status != 0) {
        slot.handle = nullptr;
        throw BackendError(std::string("cudnnCreate failed: ") + a.cudnnGetErrorString(status));
      }
    }
    slot.stream_set = false;
  }
  if (!slot.stream_set || slot.stream != stream) {
    int status = a.cudnnSetStream(slot.handle, reinterpret_cast<cudaStream_t>(stream));
    if (status != 0) throw BackendError(std::string("cudnnSetStream failed: ") + a.cudnnGetErrorString(status));
    slot.stream = stream;
    slot.stream_set = true;
  }
  return slot.handle;
}

namespace {

// stridedfa's own stream-ordered pool per device, for the memory the core allocates itself: cuDNN
// workspaces of calls that bring none and DeviceBuffer outputs. Unlike the device's default pool
// (release threshold 0: every synchronisation hands freed memory back to the driver, so a caller
// that synchronises after each call maps its workspace afresh every time), it keeps up to
// retained_bytes() of freed memory for reuse; cache_clear() trims it to nothing. Its own pool, so
// other users of the default pool (CuPy, JAX, torch's cudaMallocAsync backend) keep their settings.
struct Pools {
  std::mutex mutex;
  std::map<int32_t, cudaMemPool_t> by_device;
};
Pools& pools() {
  static Pools* p = new Pools;  // never destroyed: frees may run during interpreter exit
  return *p;
}

uint64_t retained_bytes() {
  static const uint64_t bytes = [] {
    const char* text = std::getenv("STRIDEDFA_POOL_RETAIN_BYTES");
    if (text && *text) {
      char* end = nullptr;
      const unsigned long long value = std::strtoull(text, &end, 10);
      if (end && *end == '\0') return static_cast<uint64_t>(value);
    }
    return uint64_t(512) << 20;
  }();
  return bytes;
}

cudaMemPool_t pool_for(int32_t device) {
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.by_device.find(device);
  if (it != p.by_device.end()) return it->second;
  const Api& a = loaded_api();
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  check_cuda(a.MemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  uint64_t threshold = retained_bytes();
  check_cuda(a.MemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
             "cudaMemPoolSetAttribute (release threshold)");
  p.by_device.emplace(device, pool);
  return pool;
}

void* allocate_from_pool(int32_t device, int64_t bytes, std::uintptr_t stream, const char* what) {
  void* ptr = nullptr;
  check_cuda(
      loaded_api().MallocFromPoolAsync(&ptr, size_t(bytes), pool_for(device), reinterpret_cast<cudaStream_t>(stream)),
      what);
  return ptr;
}

}  // namespace

void* pool_alloc(int32_t device, int64_t bytes, std::uintptr_t stream) {
  return allocate_from_pool(device, bytes, stream, "cudaMallocFromPoolAsync (workspace)");
}

void pool_free(void* ptr, std::uintptr_t stream) {
  check_cuda(loaded_api().FreeAsync(ptr, reinterpret_cast<cudaStream_t>(stream)), "cudaFreeAsync (workspace)");
}

void* buffer_alloc(int32_t device, int64_t bytes, std::uintptr_t stream) {
  DeviceGuard guard(device);
  return allocate_from_pool(device, bytes, stream, "cudaMallocFromPoolAsync (output buffer)");
}

void trim_pools() {
  if (!libraries_loaded()) return;
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (auto& [device, pool] : p.by_device) check_cuda(loaded_api().MemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
}

PoolStats pool_stats() {
  PoolStats stats;
  stats.retain_bytes = int64_t(retained_bytes());
  if (!libraries_loaded()) return stats;
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mutex);
  for (auto& [device, pool] : p.by_device) {
    uint64_t reserved = 0, used = 0;
    check_cuda(loaded_api().MemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved),
               "cudaMemPoolGetAttribute");
    check_cuda(loaded_api().MemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used), "cudaMemPoolGetAttribute");
    stats.reserved_bytes += int64_t(reserved);
    stats.used_bytes += int64_t(used);
  }
  return stats;
}

void buffer_free(int32_t device, void* ptr, std::uintptr_t stream, bool synchronize) noexcept {
  if (!ptr || !libraries_loaded()) return;
  try {
    DeviceGuard guard(device);
    const Api& a = api();
    if (synchronize) {
      // Consumers on other streams may still read the memory; nothing short of waiting for the
      // whole device orders this free after their work. After it, any stream will do.
      a.DeviceSynchronize();
      stream = 0;
    }
    a.FreeAsync(ptr, reinterpret_cast<cudaStream_t>(stream));
  } catch (...) {
    // A deleter must not throw; a failed free during teardown only leaks.
  }
}

void stream_wait_stream(int32_t device, std::uintptr_t consumer, std::uintptr_t producer) {
  DeviceGuard guard(device);
  const Api& a = loaded_api();
  cudaEvent_t event = nullptr;
  check_cuda(a.EventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cudaError_t status = a.EventRecord(event, reinterpret_cast<cudaStream_t>(producer));
  if (status == cudaSuccess) status = a.StreamWaitEvent(reinterpret_cast<cudaStream_t>(consumer), event, 0);
  a.EventDestroy(event);  // safe while pending: released once the recorded work completes
  check_cuda(status, "cudaEventRecord/cudaStreamWaitEvent");
}

}  // namespace stridedfa
