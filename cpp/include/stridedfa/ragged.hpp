// Variable-length (THD) calls: b sequences packed along one token axis, given by cumulative starts
// cu_seqlens (b + 1 int32 on the device). Every token-axis operand keeps its real token and head
// strides; cuDNN is told a padded (b, h, s_max, d) problem in which each sequence starts at a
// ragged offset (its start times the operand's token stride, in elements) and has a padding
// length. Those offsets and lengths are made on the device by one small kernel at launch -- never
// read on the host, so CUDA graphs and torch.compile see no data-dependent values -- and the
// padded extents are bucketed so that a training run over documents of random lengths builds a
// bounded number of graphs.
#pragma once

#include <algorithm>
#include <cstdint>

#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// The smallest m * 2^k >= n with m in {4, 5, 6, 7} and k >= 1 (8, 10, 12, 14, 16, 20, ...): a
// padded extent at most 1.25x (and 8 at least) the real one, four graphs per doubling.
int64_t length_bucket(int64_t n);

// The smallest power of two >= max(n, floor): an extent declared so that one growing by a step at
// a time (a decoding call's keys, a paged table's width) reaches a new graph once per doubling.
inline int64_t power_of_two_bucket(int64_t n, int64_t floor) {
  int64_t bucket = floor;
  while (bucket < n) bucket *= 2;
  return bucket;
}

inline constexpr int kMaxRaggedRows = 12;
inline constexpr int kMaxHeadsRows = 6;  // offsets rows of a call by heads (the kernel's parameter arrays)

// Per-sequence int32 lengths on the device (a caller's padding lengths, the core's made ones, or a
// row of the variable-length launch buffer).
struct RowLengths {
  std::uintptr_t data = 0;
  int64_t stride = 1;  // in elements
};

// What the offsets kernel makes for one call and where cuDNN reads it. Rows of `pitch` int32:
// row 0 the query lengths, row 1 the key lengths (padded_sequences each), then one row of
// padded_sequences + 1 offsets per distinct (side, token stride) among the ragged operands.
struct RaggedPlan {
  bool on = false;
  int64_t sequences = 0, padded_sequences = 0;
  int64_t total_q = 0, total_kv = 0;  // tokens of the buffers: every start and end is clamped into them
  int64_t max_q = 0, max_kv = 0;      // padded extents: a longer sequence is treated as empty
  std::uintptr_t cu_q = 0, cu_kv = 0;
  int n_rows = 0;
  uint32_t rows[kMaxRaggedRows] = {};  // token stride, with bit 31 set for the key side
  // A decoding call described by heads (call_plan.cpp): no cu_seqlens; sequence n is (batch entry
  // n / heads_kv, key/value head n % heads_kv) with len_q queries and len_kv keys (or the caller's
  // seqlens_kv), and offsets row r holds i * rows[r] + j * head_strides[r] (rows: batch strides).
  bool by_heads = false;
  int64_t heads_kv = 0, len_q = 0, len_kv = 0;
  RowLengths callers_kv;  // the caller's key lengths, or none
  uint32_t head_strides[kMaxRaggedRows] = {};
  // The token totals cuDNN is told (its workspace): a bucket of the real ones, or for a decoding
  // call (by heads, or variable-length with few queries per sequence) the padded problem's (padded
  // sequences x padded extent), which steps with the extents rather than on its own -- never less
  // than the buffer's tokens (tokens in no sequence, a sequence past its promised extent).
  bool totals_from_extents = false;
  int64_t declared_total_q() const {
    return totals_from_extents ? std::max(padded_sequences * max_q, power_of_two_bucket(total_q, 128))
                               : length_bucket(total_q);
  }
  int64_t declared_total_kv() const {
    return totals_from_extents ? std::max(padded_sequences * max_kv, power_of_two_bucket(total_kv, 128))
                               : length_bucket(total_kv);
  }
  int8_t row_of[kNumSlots] = {};                                        // the offsets row of each slot, -1: not ragged
  int64_t pitch() const { return (padded_sequences + 1 + 3) / 4 * 4; }  // 16-byte aligned rows
  int64_t bytes() const { return (2 + n_rows) * pitch() * 4; }
};

// Decoding by tokens (call_plan.cpp, plan_decode_by_tokens): a paged step of `queries` queries per
// batch entry run as entries x queries one-query sequences, sequence i * queries + t being entry
// i's token t: the launch's table copy repeats each entry's row `queries` times and makes each
// sequence's key length -- the entry's (its seqlens_kv clamped into [0, full_len], else full_len),
// under a bottom-right causal mask minus the queries after its token: L - queries + 1 + t, at least 0.
struct ByTokens {
  bool on = false;
  int64_t queries = 1;
  bool causal = false;
  int64_t full_len = 0;
};

// A prefix + tail split's table copy (split_kv.hpp; call_plan.cpp, plan_prefix_tail): each entry's
// row repeated prefix_chunks + tokens times, rows c < prefix_chunks (the prefix's chunks) shifted by
// c x chunk_blocks, rows prefix_chunks + t (the tails) to start at the prefix's end, block
// max(L - tokens, 0) / block_size with L the entry's keys (its seqlens_kv clamped into [0, full_len]).
// tokens 0: none.
struct TailRows {
  int64_t tokens = 0, block_size = 0, full_len = 0, prefix_chunks = 1, chunk_blocks = 0;
};

// How many rows of the table copy each entry's row becomes: one per token by tokens, the prefix and
// one tail per token for a prefix + tail split, else one.
inline int64_t table_copies(const ByTokens& tokens, const TailRows& tail) {
  return tokens.on ? tokens.queries : tail.tokens > 0 ? tail.prefix_chunks + tail.tokens : 1;
}

// A paged call's block table (`table`: its (b, 1, blocks, 1) view, rows contiguous) copied packed
// into `out` ((b x width) int32 on `device`, width >= blocks: the declared table's) with every id
// clamped into [0, num_blocks) and block 0 past the caller's columns, on `stream` (the same PTX
// module; driver calls: the context must be current). With `tokens.on`, (b x queries x width): each
// row repeated, and the sequences' key lengths (from `callers_kv`, data 0: none) into `lengths`.
// With `lengths_q` (not null) every row of the copy also gets `value_q` there: its query length.
// With `tail.tokens`, the rows of a prefix + tail split (no lengths: split_kv_inputs makes them).
void clamp_block_table(const TensorView& table, int64_t num_blocks, int64_t width, const ByTokens& tokens,
                       const TailRows& tail, RowLengths callers_kv, void* lengths, int32_t device, void* out,
                       std::uintptr_t stream, void* lengths_q = nullptr, int64_t value_q = 0);

// Decoding by heads through a paged view (call_plan.cpp, plan_decode_heads_paged): each (batch
// entry, key/value head) of a head-major cache one sequence of a paged problem whose blocks are the
// cache's own token rows (block size 1), its table made at launch: row s = (i, j) lists rows
// i * batch_rows + j * head_rows + c, c < length (then the last again), clamped into [0, num_blocks).
struct HeadsTable {
  bool on = false;
  int64_t rows = 0, width = 0, heads_kv = 0, batch_rows = 0, head_rows = 0, length = 0, num_blocks = 0;
};
// The table into `out` ((rows x width) int32 on `device`), on `stream` (driver calls: the context
// must be current). With `lengths` (not null) the same launch writes the sequences' lengths there:
// `rows` ones (one query each), then at `pitch` entries on `rows` times t.length (their keys).
void make_heads_table(const HeadsTable& t, int32_t device, void* out, void* lengths, int64_t pitch,
                      std::uintptr_t stream);

// An output whose rows of empty sequences and padding the launch fills after cuDNN (below).
struct EmptyRows {
  TensorView rows;         // the output as (sequences, heads, rows, inner)
  bool key_side = false;   // its rows are keys (dK, dV), not queries (out, lse, dQ)
  bool sink_rows = false;  // the statistics of a call with sinks
  int8_t ragged_row = -1;  // a variable-length call: the output's offsets row in the launch buffer
};
inline constexpr int kMaxEmptyRows = 3;

// Writes the documented value into the rows of an output that no sequence's result stands for,
// after cuDNN ran (cuDNN leaves them unwritten, or computes 0/0 for a sequence of length 0): `t`
// is (sequences, heads, rows, inner) with 2- or 4-byte items. Dense (ragged_offsets == 0): the rows
// at and past each sequence's own length, and all rows of a sequence whose other side is empty.
// Variable-length: sequence b starts at ragged_offsets[b] (elements); only the rows of sequences
// whose other side is empty. A real row of a sequence without keys gets its head's sink where
// `sinks` is given (the statistics), else `fill`. The same PTX module; the context must be current.
void fill_empty_rows(const TensorView& t, RowLengths this_side, RowLengths other_side, std::uintptr_t ragged_offsets,
                     std::uintptr_t sinks, int64_t sinks_stride, uint32_t fill, int32_t device, std::uintptr_t stream);

// Attention sinks folded in after cuDNN, for a decoding call described by heads (call_plan.cpp):
// its graph regroups the query heads, which a per-query-head sinks tensor cannot follow, so it runs
// without them and each row (i, h, r) then gets lse = logaddexp(st, sink_h) and its outputs scaled
// by exp(st - lse) in place, st the row's statistic -- the caller's lse where it asked for one,
// else a packed (b, h_q, s_q) float32 scratch the launch provides.
struct SinkFold {
  bool on = false;
  std::uintptr_t sinks = 0;  // float32, one per query head
  int64_t sinks_stride = 1;
  TensorView out, lse;  // the caller's; lse.present false: not asked for
  bool bf16 = false;    // else float16
  // Without the caller's lse: the scratch's float32 elements, (b, h_q, s_q) packed plus the padded
  // query rows past the last sequence's that the graph declares (max_q), in case cuDNN writes them.
  int64_t scratch_elements = 0;
  int64_t scratch_bytes() const { return lse.present ? 0 : scratch_elements * 4; }
};

// Folds the sinks into `f.out` and `f.lse` from the statistics at `stats` (the caller's lse, or the
// scratch: packed when `stats` is not f.lse's data). The same PTX module; the context must be current.
void fold_sinks(const SinkFold& f, std::uintptr_t stats, int32_t device, std::uintptr_t stream);

// How many blocks of fill_empty_rows share one (sequence, head)'s `elements` (rows x inner): enough
// that the launch has ~1024 blocks of 128 threads where the (sequence, head) pairs are few (one
// block each left an H100 mostly idle: 78 µs to zero the padding rows of one bf16 (2, 8, 2048, 128)
// gradient, GPU run 61's profile), at most one per 1024 elements and 64 per pair.
inline unsigned empty_rows_blocks_per_head(int64_t pairs, int64_t elements) {
  if (pairs <= 0) return 1;
  const int64_t to_fill_gpu = (1024 + pairs - 1) / pairs, by_size = (elements + 1023) / 1024;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>({int64_t(64), to_fill_gpu, by_size})));
}

// Launches the offsets kernel into `buffer` (ragged.bytes() on `device`) on `stream`. Driver
// calls: the device's context must be current.
void make_ragged_offsets(const RaggedPlan& ragged, int32_t device, void* buffer, std::uintptr_t stream);

}  // namespace stridedfa
