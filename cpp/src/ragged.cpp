#include "stridedfa/ragged.hpp"

#include <mutex>

#include "stridedfa/cuda_driver.hpp"
#include "stridedfa/errors.hpp"

namespace stridedfa {

int64_t length_bucket(int64_t n) {
  int64_t step = 2;  // values m * step, m in 4..7
  while (7 * step < n) step *= 2;
  for (int64_t m = 4; m <= 7; ++m) {
    if (m * step >= n) return m * step;
  }
  return 8 * step;  // not reached
}

namespace {

const char kRaggedOffsetsPtx[] =
#include "ragged_offsets.ptx.inc"
    ;

constexpr int kMaxDevices = 64;

// The kernel, loaded once per device into its primary context (the driver JIT-compiles the PTX).
CUfunction ragged_kernel(int32_t device) {
  static std::mutex mutex;
  static CUfunction functions[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) throw BackendError("stridedfa: CUDA device ordinal out of range");
  std::lock_guard<std::mutex> lock(mutex);
  if (!functions[device]) {
    const Driver& d = driver();
    CUmodule module = nullptr;
    check_driver(d.module_load_data(&module, kRaggedOffsetsPtx), "cuModuleLoadData (stridedfa's offsets kernel)");
    check_driver(d.module_get_function(&functions[device], module, "stridedfa_ragged_offsets"),
                 "cuModuleGetFunction (stridedfa_ragged_offsets)");
  }
  return functions[device];
}

}  // namespace

void make_ragged_offsets(const RaggedPlan& r, int32_t device, void* buffer, std::uintptr_t stream) {
  CUfunction kernel = ragged_kernel(device);
  unsigned long long cu_q = r.cu_q, cu_kv = r.cu_kv, out = reinterpret_cast<std::uintptr_t>(buffer);
  unsigned int batch = unsigned(r.sequences), batch_pad = unsigned(r.padded_sequences), pitch = unsigned(r.pitch());
  unsigned int total_q = unsigned(r.total_q), total_kv = unsigned(r.total_kv);
  unsigned int max_q = unsigned(r.max_q), max_kv = unsigned(r.max_kv), n_rows = unsigned(r.n_rows);
  uint32_t rows[kMaxRaggedRows] = {};
  for (int i = 0; i < r.n_rows; ++i) rows[i] = r.rows[i];
  void* params[] = {&cu_q,    &cu_kv,    &out,   &batch,  &batch_pad, &pitch,
                    &total_q, &total_kv, &max_q, &max_kv, &n_rows,    rows};
  const unsigned threads = 128, blocks = unsigned((r.padded_sequences + 1 + threads - 1) / threads);
  check_driver(driver().launch_kernel(kernel, blocks, 1, 1, threads, 1, 1, 0, reinterpret_cast<CUstream>(stream),
                                      params, nullptr),
               "cuLaunchKernel (stridedfa_ragged_offsets)");
}

}  // namespace stridedfa
