// Split-KV decoding of a paged cache (issue 33 item 2). One query per sequence against a long cache
// occupies batch x query heads of cuDNN's thread blocks, a few percent of the GPU at small batch.
// Split instead: chunk c of batch entry i's keys becomes sequence n = i * chunks + c of a paged
// problem batch x chunks large -- its block-table row the entry's row cut into chunks (the launch's
// packed copy of the table, read (batch x chunks, blocks_per_chunk)), its key length its chunk's
// share, its query a copy of the entry's -- and the partial outputs are merged by their log-sum-exp
// (FlashAttention's flash-decoding; the merge context parallelism does across GPUs). Planned in
// call_plan.cpp (plan_split_kv); the two small kernels are in ragged_offsets.ptx.inc.
#pragma once

#include <cstdint>

#include "stridedfa/ragged.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// Whether paged decoding calls may be split (STRIDEDFA_SPLIT_KV=auto; off by default). GPU run 64
// (H100, cuDNN 9.19): once a one-query step is planned without a mask (call_plan.cpp,
// one_row_sees_every_key), cuDNN's own decoding kernel is as fast unsplit as split at every batch
// and cache length measured (b1 x 8k: 19.0 µs unsplit, 19.0-20.7 split; b1 x 1k: 13.1 vs 13.3-14.5),
// so splitting stays off; it was the causal mask that made the unsplit step slow. The setter is
// for tests and benchmarks; split graphs have keys of their own.
bool split_kv_enabled();
void set_split_kv_enabled(bool enabled);
// Benchmarks' sweeps: every split-able call cut into `chunks` (at most one per block of its table;
// 1: none), 0 for the heuristic's choice.
void set_split_kv_chunks(int64_t chunks);

// How many chunks (a power of two, 1: no split) a decoding call of `batch` entries x `heads_q` query
// heads over at most `keys` keys per entry is cut into: enough thread blocks for two waves of a large
// GPU, never chunks of fewer than 256 keys.
int64_t split_kv_chunks(int64_t batch, int64_t heads_q, int64_t keys);

struct SplitKv {
  bool on = false;
  int64_t batch = 0, chunks = 0, heads = 0, d_qk = 0, d_v = 0;
  int64_t blocks_per_chunk = 0, keys_per_chunk = 0;
  int64_t full_len = 0;  // keys per entry without the caller's lengths (the table's)
  bool bf16 = false;     // else float16
  // The caller's q (read), out and lse (written; lse.present false: not asked for).
  TensorView q, out, lse;
  // The caller's sinks (float32 per query head; 0: none): applied by the merge, not by cuDNN.
  std::uintptr_t sinks = 0;
  int64_t sinks_stride = 1;
  // A prefix + tail split of `tokens` > 1 queries per entry (call_plan.cpp, plan_prefix_tail): the
  // tokens folded into `heads` (the caller's x tokens, head-major), chunks = 1 + tokens -- the prefix
  // every token sees, then each token's tail -- each a whole row of the table copy (the tails' shifted
  // to the prefix's end: ragged.hpp TailRows), merged per row from its two chunks.
  int64_t tokens = 1, block_size = 0;
  // Query rows per (sequence, head) as cuDNN reads the split queries: 1 (the folded heads its heads:
  // the one-query kernel), or a prefix + tail's heads / h_kv (a key head's group x tokens as its rows,
  // h_kv heads: the general kernel, which reads the keys once per group). Same packed memory.
  int64_t rows = 1;
  bool prefix_tail() const { return tokens > 1; }
  // A prefix + tail split's prefix is cut into chunks - tokens pieces of blocks_per_chunk blocks:
  // sequence i x chunks + c < prefix_chunks() the prefix's chunk c, then the tails.
  int64_t prefix_chunks() const { return prefix_tail() ? chunks - tokens : 1; }
  TailRows tail_rows() const {  // its table copy's
    return {prefix_tail() ? tokens : 0, block_size, full_len, prefix_chunks(), blocks_per_chunk};
  }
  int64_t sequences() const { return batch * chunks; }
  int64_t lengths_pitch() const;  // int32 entries from the query lengths' row to the keys' (16-byte aligned)
};

// The launch's scratch of a split call, one allocation: the split queries, the partial outputs and
// statistics (packed), and two rows of sequences() int32 lengths (queries, keys), lengths_pitch() apart.
enum class SplitPart { queries, outputs, statistics, lengths_q, lengths_kv };
int64_t split_kv_bytes(const SplitKv& s);
void* split_kv_part(const SplitKv& s, void* scratch, SplitPart part);

// The launch's two kernels (driver calls: the device's context must be current): the split queries
// and lengths (from the caller's seqlens_kv, data 0: none) before cuDNN, the merge into the caller's
// out and lse after it.
void split_kv_inputs(const SplitKv& s, void* scratch, RowLengths callers_kv, int32_t device, std::uintptr_t stream);
void split_kv_merge(const SplitKv& s, void* scratch, int32_t device, std::uintptr_t stream);

}  // namespace stridedfa
