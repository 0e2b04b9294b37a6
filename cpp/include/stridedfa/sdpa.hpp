// The core's entry points for scaled-dot-product attention. Every tensor arrives as a TensorView
// with logical axes (batch, heads, seq, head_dim); its memory order is given by strides alone.
//
//   prepare_*  validates every tensor (nothing is launched or built when it throws), then finds
//              the cuDNN graph for this exact configuration in the cache, building it on a miss.
//   execute    launches a prepared call on the caller's stream.
//
// Both are safe to call without the GIL and from several threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "stridedfa/ragged.hpp"
#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/split_kv.hpp"
#include "stridedfa/tensor_view.hpp"
#include "stridedfa/validate.hpp"
#include "stridedfa/visibility.hpp"

namespace stridedfa {

class BuiltGraph;

struct PreparedCall {
  std::shared_ptr<const BuiltGraph> graph;  // null when there is nothing for cuDNN to compute
  Problem problem;
  // What the launch needs from the caller's workspace: cuDNN's own workspace first, then the
  // launch's scratch (the tables, lengths, offsets and staging below), so that one allocation by
  // the caller's allocator serves the whole call and the launch allocates nothing itself.
  int64_t workspace_bytes = 0;
  int64_t cudnn_workspace_bytes = 0;
  int n_ptrs = 0;
  void* ptrs[kMaxGraphTensors] = {};  // device pointers in the graph's sorted-UID order
  // Output regions no query or key of the mask takes part in (visibility.hpp), filled at launch.
  int n_fills = 0;
  Fill fills[kMaxFills];
  int n_copies = 0;
  Copy copies[kMaxCopies];
  // A row-restricted view of the caller's lse that cuDNN cannot take (misaligned, or not packed
  // on an older cuDNN) goes through a packed staging buffer at launch (ptrs[staged_lse_ptr]):
  // copied in before a backward, out of it after a forward (staged_lse_output).
  int staged_lse_ptr = -1;
  TensorView staged_lse_source;
  bool staged_lse_output = false;
  // Padding lengths the core made (full extents): filled on the device at launch into ptrs[i].
  int made_lengths_ptr[2] = {-1, -1};
  int64_t made_lengths_value[2] = {0, 0};
  int64_t made_lengths_rows = 0;  // entries per made row: the plan's batch (by heads: b x h_kv), not the caller's
  // Which made lengths the launch's table kernel writes beside its table (no fill of their own):
  // the paged view's both, a paged call's queries' (sdpa.cpp, lay_out_scratch).
  bool made_lengths_by_table[2] = {false, false};
  // A variable-length call: the lengths and offsets the kernel makes at launch, and the row of its
  // buffer each pointer is (-1: the pointer in ptrs).
  RaggedPlan ragged;
  int8_t ragged_row_of_ptr[kMaxGraphTensors] = {};
  // Outputs whose rows of empty sequences and padding get their documented values after cuDNN
  // (ragged.hpp fill_empty_rows), from the caller's lengths, else those the launch makes
  // (ptrs[lengths_ptr[side]]), and for the statistics the sinks.
  int n_empty_rows = 0;
  EmptyRows empty_rows[kMaxEmptyRows];
  RowLengths callers_lengths[2];  // data 0: not given
  int lengths_ptr[2] = {-1, -1};
  std::uintptr_t sinks = 0;
  int64_t sinks_stride = 1;
  // A paged call: the caller's block table, copied with every id clamped into [0, num_blocks)
  // at launch; the ptrs of both page tables (K's, V's) get the copy.
  bool paged = false;
  TensorView block_table;
  int64_t num_blocks = 0;
  int64_t table_width = 0;  // the copy's (and the graph's) columns: a bucket of the caller's
  int page_table_ptr[2] = {-1, -1};
  // Decoding by heads through a paged view: the table the launch makes (ragged.hpp HeadsTable),
  // given to the same page-table ptrs.
  HeadsTable heads_table;
  // A paged step run by tokens (ragged.hpp ByTokens): the table copy repeats each entry's row, and
  // ptrs[lengths_ptr[1]] gets the key lengths the copy's kernel makes beside it.
  ByTokens by_tokens;
  // A paged decoding call split over its keys (split_kv.hpp): the ptrs that get the launch's
  // scratch, by SplitPart (queries, outputs, statistics, lengths_q, lengths_kv).
  SplitKv split;
  int split_ptr[5] = {-1, -1, -1, -1, -1};
  // A decoding call by heads with sinks, folded in after cuDNN (ragged.hpp); without the caller's
  // lse, ptrs[sink_fold_lse_ptr] gets the launch's scratch for the statistics.
  SinkFold sink_fold;
  int sink_fold_lse_ptr = -1;
  // Where each piece of the launch's scratch lies in the workspace, after cuDNN's own (byte
  // offsets, each 256-byte aligned; -1 where the call has none), laid out once by prepare.
  struct Scratch {
    int64_t table = -1;       // a paged call's clamped table (by tokens: the key lengths beside it,
    int64_t table_bytes = 0;  // table_bytes on), or decoding by heads' made table
    int64_t split = -1, ragged = -1, lengths = -1, staged = -1, folded = -1;
    int64_t lengths_pitch = 0;  // int32 entries from the made query lengths to the keys' (16-byte rows)
  } scratch;
};

// Validate, then look up or build the graph. Throws BackendError when cuDNN is not loaded.
PreparedCall prepare_call(const CallOperands& call, const SdpaOptions& options);

// The graph-cache key of a call on a device of compute capability `sm_version` with cuDNN
// `cudnn_version` (validates first). Calls with equal keys share one cuDNN graph.
std::vector<int64_t> call_graph_key(const CallOperands& call, const SdpaOptions& options, int32_t sm_version,
                                    int64_t cudnn_version);

// How many times execute() allocated cuDNN's workspace itself (from its pool) because the caller
// passed none. Framework adapters always pass one from their allocator; tests check this stays put
// (e.g. across a CUDA-graph capture).
int64_t own_workspace_allocations();

// Launch on `stream` (a cudaStream_t as an integer; 0 is the legacy default stream). `workspace`
// must hold call.workspace_bytes on the call's device, 64-byte aligned, and stay valid for the
// stream's work; when null, it is taken from and returned to stridedfa's pool of the device
// (runtime.hpp), one allocation for the whole call.
void execute(const PreparedCall& call, std::uintptr_t stream, void* workspace);

}  // namespace stridedfa
