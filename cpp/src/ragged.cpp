#include "stridedfa/ragged.hpp"

#include <mutex>

#include "stridedfa/cuda_driver.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/split_kv.hpp"

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

// The kernels, loaded once per device into its primary context (the driver JIT-compiles the PTX).
struct Kernels {
  CUfunction offsets = nullptr, heads_offsets = nullptr, clamp_blocks = nullptr, empty_rows = nullptr;
  CUfunction split_inputs = nullptr, split_merge = nullptr, fold_sinks = nullptr, heads_table = nullptr;
  bool ready = false;  // set once every function was found (a failed lookup is retried, not half-used)
};

const Kernels& kernels(int32_t device) {
  static std::mutex mutex;
  static Kernels loaded[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) throw BackendError("stridedfa: CUDA device ordinal out of range");
  std::lock_guard<std::mutex> lock(mutex);
  Kernels& k = loaded[device];
  if (!k.ready) {
    const Driver& d = driver();
    CUmodule module = nullptr;
    check_driver(d.module_load_data(&module, kRaggedOffsetsPtx), "cuModuleLoadData (stridedfa's kernels)");
    check_driver(d.module_get_function(&k.clamp_blocks, module, "stridedfa_clamp_blocks"),
                 "cuModuleGetFunction (stridedfa_clamp_blocks)");
    check_driver(d.module_get_function(&k.empty_rows, module, "stridedfa_fill_empty_rows"),
                 "cuModuleGetFunction (stridedfa_fill_empty_rows)");
    check_driver(d.module_get_function(&k.heads_offsets, module, "stridedfa_heads_offsets"),
                 "cuModuleGetFunction (stridedfa_heads_offsets)");
    check_driver(d.module_get_function(&k.offsets, module, "stridedfa_ragged_offsets"),
                 "cuModuleGetFunction (stridedfa_ragged_offsets)");
    check_driver(d.module_get_function(&k.split_inputs, module, "stridedfa_split_inputs"),
                 "cuModuleGetFunction (stridedfa_split_inputs)");
    check_driver(d.module_get_function(&k.split_merge, module, "stridedfa_split_merge"),
                 "cuModuleGetFunction (stridedfa_split_merge)");
    check_driver(d.module_get_function(&k.fold_sinks, module, "stridedfa_fold_sinks"),
                 "cuModuleGetFunction (stridedfa_fold_sinks)");
    check_driver(d.module_get_function(&k.heads_table, module, "stridedfa_heads_table"),
                 "cuModuleGetFunction (stridedfa_heads_table)");
    k.ready = true;
  }
  return k;
}

void launch_blocks(CUfunction kernel, unsigned blocks, unsigned blocks_y, void** params, std::uintptr_t stream,
                   const char* what) {
  if (blocks == 0) return;
  check_driver(driver().launch_kernel(kernel, blocks, blocks_y, 1, 128, 1, 1, 0, reinterpret_cast<CUstream>(stream),
                                      params, nullptr),
               what);
}

void launch(CUfunction kernel, int64_t threads_needed, void** params, std::uintptr_t stream, const char* what) {
  const unsigned threads = 128, blocks = unsigned((threads_needed + threads - 1) / threads);
  if (blocks == 0) return;
  check_driver(driver().launch_kernel(kernel, blocks, 1, 1, threads, 1, 1, 0, reinterpret_cast<CUstream>(stream),
                                      params, nullptr),
               what);
}

void make_heads_offsets(const RaggedPlan& r, int32_t device, void* buffer, std::uintptr_t stream) {
  CUfunction kernel = kernels(device).heads_offsets;
  unsigned long long seqlens_kv = r.callers_kv.data, out = reinterpret_cast<std::uintptr_t>(buffer);
  unsigned int sequences = unsigned(r.sequences), batch_pad = unsigned(r.padded_sequences), pitch = unsigned(r.pitch());
  unsigned int heads_kv = unsigned(r.heads_kv), len_q = unsigned(r.len_q), len_kv = unsigned(r.len_kv);
  unsigned int seqlens_stride = unsigned(r.callers_kv.stride), n_rows = unsigned(r.n_rows);
  uint32_t batch_strides[kMaxHeadsRows] = {}, head_strides[kMaxHeadsRows] = {};
  for (int i = 0; i < r.n_rows; ++i) {
    batch_strides[i] = r.rows[i];
    head_strides[i] = r.head_strides[i];
  }
  void* params[] = {&seqlens_kv, &out,    &sequences,      &batch_pad, &pitch,        &heads_kv,
                    &len_q,      &len_kv, &seqlens_stride, &n_rows,    batch_strides, head_strides};
  launch(kernel, r.padded_sequences + 1, params, stream, "cuLaunchKernel (stridedfa_heads_offsets)");
}

}  // namespace

void make_ragged_offsets(const RaggedPlan& r, int32_t device, void* buffer, std::uintptr_t stream) {
  if (r.by_heads) {
    make_heads_offsets(r, device, buffer, stream);
    return;
  }
  CUfunction kernel = kernels(device).offsets;
  unsigned long long cu_q = r.cu_q, cu_kv = r.cu_kv, out = reinterpret_cast<std::uintptr_t>(buffer);
  unsigned int batch = unsigned(r.sequences), batch_pad = unsigned(r.padded_sequences), pitch = unsigned(r.pitch());
  unsigned int total_q = unsigned(r.total_q), total_kv = unsigned(r.total_kv);
  unsigned int max_q = unsigned(r.max_q), max_kv = unsigned(r.max_kv), n_rows = unsigned(r.n_rows);
  uint32_t rows[kMaxRaggedRows] = {};
  for (int i = 0; i < r.n_rows; ++i) rows[i] = r.rows[i];
  void* params[] = {&cu_q,    &cu_kv,    &out,   &batch,  &batch_pad, &pitch,
                    &total_q, &total_kv, &max_q, &max_kv, &n_rows,    rows};
  launch(kernel, r.padded_sequences + 1, params, stream, "cuLaunchKernel (stridedfa_ragged_offsets)");
}

void clamp_block_table(const TensorView& table, int64_t num_blocks, int64_t width, const ByTokens& tokens,
                       const TailRows& tail, RowLengths callers_kv, void* lengths, int32_t device, void* out,
                       std::uintptr_t stream, void* lengths_q, int64_t value_q) {
  CUfunction kernel = kernels(device).clamp_blocks;
  const int64_t repeat = table_copies(tokens, tail);
  unsigned long long in = table.data, packed = reinterpret_cast<std::uintptr_t>(out);
  unsigned int rows = unsigned(table.dims[0] * repeat), cols = unsigned(table.dims[2]);
  unsigned int row_stride = unsigned(table.dims[0] > 1 ? table.strides[0] : table.dims[2]);
  unsigned int blocks = unsigned(num_blocks), out_cols = unsigned(width), copies = unsigned(repeat);
  unsigned long long seqlens = tokens.on || tail.tokens > 0 ? callers_kv.data : 0,
                     made = tokens.on ? reinterpret_cast<std::uintptr_t>(lengths) : 0;
  unsigned int seqlens_stride = unsigned(callers_kv.stride);
  unsigned int full_len = unsigned(tokens.on ? tokens.full_len : tail.full_len);
  unsigned int causal = tokens.on && tokens.causal ? 1u : 0u;
  unsigned long long made_q = reinterpret_cast<std::uintptr_t>(lengths_q);
  unsigned int queries = unsigned(value_q), tail_block = unsigned(tail.tokens > 0 ? tail.block_size : 0);
  unsigned int prefix_chunks = unsigned(tail.prefix_chunks), chunk_blocks = unsigned(tail.chunk_blocks);
  void* params[] = {&in,       &packed, &rows,    &cols,           &row_stride,    &blocks,
                    &out_cols, &copies, &seqlens, &seqlens_stride, &made,          &full_len,
                    &causal,   &made_q, &queries, &tail_block,     &prefix_chunks, &chunk_blocks};
  launch(kernel, int64_t(rows) * width, params, stream, "cuLaunchKernel (stridedfa_clamp_blocks)");
}

void make_heads_table(const HeadsTable& t, int32_t device, void* out, void* lengths, int64_t pitch,
                      std::uintptr_t stream) {
  CUfunction kernel = kernels(device).heads_table;
  unsigned long long table = reinterpret_cast<std::uintptr_t>(out), made = reinterpret_cast<std::uintptr_t>(lengths);
  unsigned int rows = unsigned(t.rows), width = unsigned(t.width), heads_kv = unsigned(t.heads_kv);
  unsigned int batch_rows = unsigned(t.batch_rows), head_rows = unsigned(t.head_rows);
  unsigned int length = unsigned(t.length), num_blocks = unsigned(t.num_blocks), row_pitch = unsigned(pitch);
  void* params[] = {&table, &rows, &width, &heads_kv, &batch_rows, &head_rows, &length, &num_blocks, &made, &row_pitch};
  launch(kernel, t.rows * t.width, params, stream, "cuLaunchKernel (stridedfa_heads_table)");
}

void fill_empty_rows(const TensorView& t, RowLengths this_side, RowLengths other_side, std::uintptr_t ragged_offsets,
                     std::uintptr_t sinks, int64_t sinks_stride, uint32_t fill, int32_t device, std::uintptr_t stream) {
  CUfunction kernel = kernels(device).empty_rows;
  unsigned long long data = t.data, offsets = ragged_offsets, len_this = this_side.data, len_other = other_side.data;
  unsigned long long sink_values = sinks;
  long long stride_b = t.strides[0], stride_h = t.strides[1], stride_s = t.strides[2];
  unsigned int this_stride = unsigned(this_side.stride), other_stride = unsigned(other_side.stride);
  unsigned int sink_stride = unsigned(sinks_stride), heads = unsigned(t.dims[1]), rows = unsigned(t.dims[2]);
  unsigned int inner = unsigned(t.dims[3]), item_bytes = unsigned(t.itemsize()), pattern = fill;
  unsigned int ragged = ragged_offsets != 0;
  void* params[] = {&data,     &offsets,  &len_this,    &len_other,    &sink_values, &stride_b,
                    &stride_h, &stride_s, &this_stride, &other_stride, &sink_stride, &heads,
                    &rows,     &inner,    &item_bytes,  &pattern,      &ragged};
  launch_blocks(kernel, unsigned(t.dims[0] * t.dims[1]),
                empty_rows_blocks_per_head(t.dims[0] * t.dims[1], t.dims[2] * t.dims[3]), params, stream,
                "cuLaunchKernel (stridedfa_fill_empty_rows)");
}

void split_kv_inputs(const SplitKv& s, void* scratch, RowLengths callers_kv, int32_t device, std::uintptr_t stream) {
  CUfunction kernel = kernels(device).split_inputs;
  unsigned long long q = s.q.data,
                     q_split = reinterpret_cast<std::uintptr_t>(split_kv_part(s, scratch, SplitPart::queries));
  unsigned long long lengths = reinterpret_cast<std::uintptr_t>(split_kv_part(s, scratch, SplitPart::lengths_q));
  unsigned long long seqlens_kv = callers_kv.data;
  unsigned int seqlens_stride = unsigned(callers_kv.stride), batch = unsigned(s.batch), chunks = unsigned(s.chunks);
  unsigned int heads = unsigned(s.heads), d = unsigned(s.d_qk);
  long long stride_b = s.q.strides[0], stride_h = s.q.strides[1], stride_d = s.q.strides[3];
  long long stride_s = s.q.strides[2];
  unsigned int full_len = unsigned(s.full_len), keys_per_chunk = unsigned(s.keys_per_chunk);
  unsigned int pitch = unsigned(s.lengths_pitch()), tokens = unsigned(s.tokens), block_size = unsigned(s.block_size);
  unsigned int rows_q = unsigned(s.rows);
  void* params[] = {&q,     &q_split, &lengths,  &seqlens_kv, &seqlens_stride, &batch,    &chunks,
                    &heads, &d,       &stride_b, &stride_h,   &stride_d,       &full_len, &keys_per_chunk,
                    &pitch, &tokens,  &stride_s, &block_size, &rows_q};
  launch(kernel, s.sequences() * s.heads * s.d_qk, params, stream, "cuLaunchKernel (stridedfa_split_inputs)");
}

void split_kv_merge(const SplitKv& s, void* scratch, int32_t device, std::uintptr_t stream) {
  CUfunction kernel = kernels(device).split_merge;
  unsigned long long partial_out = reinterpret_cast<std::uintptr_t>(split_kv_part(s, scratch, SplitPart::outputs));
  unsigned long long partial_lse = reinterpret_cast<std::uintptr_t>(split_kv_part(s, scratch, SplitPart::statistics));
  unsigned long long lengths_kv = reinterpret_cast<std::uintptr_t>(split_kv_part(s, scratch, SplitPart::lengths_kv));
  unsigned long long out = s.out.data, lse = s.lse.present ? s.lse.data : 0;
  unsigned int batch = unsigned(s.batch), chunks = unsigned(s.chunks), heads = unsigned(s.heads), d = unsigned(s.d_v);
  long long out_b = s.out.strides[0], out_h = s.out.strides[1], out_d = s.out.strides[3];
  long long lse_b = s.lse.present ? s.lse.strides[0] : 0, lse_h = s.lse.present ? s.lse.strides[1] : 0;
  long long out_s = s.out.strides[2], lse_s = s.lse.present ? s.lse.strides[2] : 0;
  unsigned int is_bf16 = s.bf16 ? 1u : 0u, tokens = unsigned(s.tokens);
  unsigned long long sinks = s.sinks;
  long long sinks_stride = s.sinks_stride;
  void* params[] = {&partial_out, &partial_lse, &lengths_kv,   &out,    &lse,   &batch, &chunks,
                    &heads,       &d,           &out_b,        &out_h,  &out_d, &lse_b, &lse_h,
                    &is_bf16,     &sinks,       &sinks_stride, &tokens, &out_s, &lse_s};
  launch(kernel, s.batch * s.heads * s.d_v, params, stream, "cuLaunchKernel (stridedfa_split_merge)");
}

void fold_sinks(const SinkFold& f, std::uintptr_t stats, int32_t device, std::uintptr_t stream) {
  CUfunction kernel = kernels(device).fold_sinks;
  const TensorView& o = f.out;
  unsigned long long out = o.data, stats_data = stats, lse = f.lse.present ? f.lse.data : 0, sinks = f.sinks;
  long long out_b = o.strides[0], out_h = o.strides[1], out_s = o.strides[2], out_d = o.strides[3];
  const bool callers = f.lse.present && stats == f.lse.data;  // else the packed scratch
  long long stats_b = callers ? f.lse.strides[0] : o.dims[1] * o.dims[2];
  long long stats_h = callers ? f.lse.strides[1] : o.dims[2];
  long long stats_s = callers ? f.lse.strides[2] : 1;
  long long lse_b = f.lse.present ? f.lse.strides[0] : 0, lse_h = f.lse.present ? f.lse.strides[1] : 0;
  long long lse_s = f.lse.present ? f.lse.strides[2] : 0, sinks_stride = f.sinks_stride;
  unsigned int batch = unsigned(o.dims[0]), heads = unsigned(o.dims[1]), rows = unsigned(o.dims[2]);
  unsigned int d = unsigned(o.dims[3]), is_bf16 = f.bf16 ? 1u : 0u;
  void* params[] = {&out,   &out_b, &out_h, &out_s, &out_d,        &stats_data, &stats_b, &stats_h, &stats_s, &lse,
                    &lse_b, &lse_h, &lse_s, &sinks, &sinks_stride, &batch,      &heads,   &rows,    &d,       &is_bf16};
  launch(kernel, o.dims[0] * o.dims[1] * o.dims[2] * 32, params, stream,  // a warp per row
         "cuLaunchKernel (stridedfa_fold_sinks)");
}

}  // namespace stridedfa
