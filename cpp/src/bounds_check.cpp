#include "stridedfa/bounds_check.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "stridedfa/cuda_driver.hpp"
#include "stridedfa/errors.hpp"

namespace stridedfa {

bool bounds_check_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("STRIDEDFA_CHECK_BOUNDS");
    return value && *value && std::string(value) != "0";
  }();
  return enabled;
}

namespace {

// n int32 values `stride` elements apart at `data` on the device, after the stream's earlier work.
std::vector<int32_t> read_ints(std::uintptr_t data, int64_t n, int64_t stride, std::uintptr_t stream) {
  if (n <= 0) return {};
  const int64_t span = (n - 1) * stride + 1;
  std::vector<int32_t> all(static_cast<size_t>(span));
  const Driver& d = driver();
  CUstream s = reinterpret_cast<CUstream>(stream);
  check_driver(d.memcpy_dtoh(all.data(), CUdeviceptr(data), size_t(span) * sizeof(int32_t), s),
               "cuMemcpyDtoHAsync (the bounds check)");
  check_driver(d.stream_synchronize(s), "cuStreamSynchronize (the bounds check)");
  if (stride == 1) return all;
  std::vector<int32_t> picked(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) picked[size_t(i)] = all[size_t(i * stride)];
  return picked;
}

[[noreturn]] void out_of_bounds(const std::string& what) {
  throw BoundsError(what +
                    " (found by STRIDEDFA_CHECK_BOUNDS; without it the value is clamped on the device and "
                    "the call computes on other keys than meant)");
}

// The lengths, read back once and checked; empty when not given.
std::vector<int32_t> check_lengths(const char* name, const RowLengths& given, int64_t b, int64_t most, const char* unit,
                                   std::uintptr_t stream) {
  if (!given.data) return {};
  std::vector<int32_t> lengths = read_ints(given.data, b, given.stride, stream);
  for (int64_t i = 0; i < b; ++i) {
    const int32_t n = lengths[size_t(i)];
    if (n < 0 || n > most) {
      out_of_bounds(std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(n) + " is outside [0, " +
                    std::to_string(most) + "], the " + unit);
    }
  }
  return lengths;
}

void check_cu_seqlens(const char* name, std::uintptr_t data, int64_t sequences, int64_t tokens, int64_t longest,
                      std::uintptr_t stream) {
  const std::vector<int32_t> cu = read_ints(data, sequences + 1, 1, stream);
  for (int64_t i = 0; i <= sequences; ++i) {
    const int32_t at = cu[size_t(i)];
    const std::string entry = std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(at);
    if (at < 0 || at > tokens) {
      out_of_bounds(entry + " is outside the " + std::to_string(tokens) + " tokens of the packed tensors");
    }
    if (i > 0 && at < cu[size_t(i - 1)]) {
      out_of_bounds(entry + " is below the entry before it (" + std::to_string(cu[size_t(i - 1)]) +
                    "): cu_seqlens must not decrease");
    }
    if (i > 0 && at - cu[size_t(i - 1)] > longest) {
      out_of_bounds("sequence " + std::to_string(i - 1) + " has " + std::to_string(at - cu[size_t(i - 1)]) +
                    " tokens in " + name + ", more than the " + std::to_string(longest) +
                    " its call was planned for (max_seqlen, bucketed): pass a max_seqlen at least as long");
    }
  }
}

void check_block_table(const PreparedCall& call, std::uintptr_t stream) {
  const Problem& p = call.problem;
  const int64_t capacity = p.blocks * p.block_size;
  const std::string unit = "keys block_table holds per sequence (" + std::to_string(p.blocks) + " blocks of " +
                           std::to_string(p.block_size) + ")";
  const std::vector<int32_t> n =
      check_lengths("seqlens_kv", call.callers_lengths[1], p.b, capacity, unit.c_str(), stream);
  const TensorView& table = call.block_table;  // (b, 1, blocks, 1)
  const int64_t row_stride = table.dims[0] > 1 ? table.strides[0] : table.dims[2];
  const std::vector<int32_t> ids = read_ints(table.data, p.b * row_stride, 1, stream);
  for (int64_t b = 0; b < p.b; ++b) {
    const int64_t used = (int64_t(n[size_t(b)]) + p.block_size - 1) / p.block_size;
    for (int64_t c = 0; c < used; ++c) {
      const int32_t id = ids[size_t(b * row_stride + c * table.strides[2])];
      if (id < 0 || id >= p.num_blocks) {
        out_of_bounds("block_table[" + std::to_string(b) + ", " + std::to_string(c) + "] = " + std::to_string(id) +
                      " is outside the cache's " + std::to_string(p.num_blocks) + " blocks");
      }
    }
  }
}

bool capturing(std::uintptr_t stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  check_driver(driver().stream_is_capturing(reinterpret_cast<CUstream>(stream), &status),
               "cuStreamIsCapturing (the bounds check)");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

void check_bounds(const PreparedCall& call, std::uintptr_t stream) {
  const bool lengths = call.callers_lengths[0].data || call.callers_lengths[1].data;
  if (!(call.paged || call.ragged.on || lengths) || capturing(stream)) return;
  const Problem& p = call.problem;
  if (call.ragged.on && call.ragged.by_heads) {  // the core's own offsets; the caller's key lengths at most
    check_lengths("seqlens_kv", call.callers_lengths[1], p.b, p.s_kv, "keys of the tensors", stream);
    return;
  }
  if (call.ragged.on) {
    check_cu_seqlens("cu_seqlens_q", call.ragged.cu_q, call.ragged.sequences, call.ragged.total_q, call.ragged.max_q,
                     stream);
    check_cu_seqlens("cu_seqlens_kv", call.ragged.cu_kv, call.ragged.sequences, call.ragged.total_kv,
                     call.ragged.max_kv, stream);
    return;
  }
  check_lengths("seqlens_q", call.callers_lengths[0], p.b, p.s_q, "queries of the tensors", stream);
  if (call.paged) {
    check_block_table(call, stream);
    return;
  }
  check_lengths("seqlens_kv", call.callers_lengths[1], p.b, p.s_kv, "keys of the tensors", stream);
}

}  // namespace stridedfa
