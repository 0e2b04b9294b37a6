// The plan of one call: what cuDNN is handed once the mask's empty rows and keys are cut off
// (visibility.hpp), the core's own work around it (fills, a copy, padding lengths it makes, a
// staged lse), and the calls cuDNN has no graph for (s_q = s_kv = 1 backward). sdpa.cpp turns
// a plan into a graph spec and a launch.
#pragma once

#include <cstdint>

#include "stridedfa/ragged.hpp"
#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/split_kv.hpp"
#include "stridedfa/tensor_view.hpp"
#include "stridedfa/visibility.hpp"

namespace stridedfa {

// What a call hands cuDNN once the mask's empty rows and keys are cut off: the operands as views
// of the caller's tensors, the fills for the regions cut off, and whether the statistics must be
// staged packed.
struct Plan {
  Problem problem;  // the sub-problem cuDNN computes
  // What cuDNN is given per slot: the caller's view, or views[slot] where the plan changed it.
  const TensorView* slots[kNumSlots] = {};
  SlotViews views;  // only where the plan changed a view
  int n_fills = 0;
  Fill fills[kMaxFills];
  int n_copies = 0;
  Copy copies[kMaxCopies];
  bool stage_lse = false;
  TensorView lse_source;
  bool nothing_for_cudnn = false;
  // Padding lengths the core makes itself (full extents, filled on the device at launch): the side
  // a caller left out, or both where cuDNN runs a band with s_q > s_kv only in padding mode.
  int64_t made_lengths[2] = {-1, -1};  // value for seqlens_q, seqlens_kv; -1: not made
  bool unmasked = false;               // the sub-problem needs no mask (every pair takes part)
  bool keeps_keys = false;             // every key described, also those no row sees
  // Outputs whose rows of empty sequences and padding the launch fills after cuDNN (padding
  // lengths, variable-length and paged calls): cuDNN computes 0/0 for a sequence of length 0.
  int n_empty_rows = 0;
  EmptyRows empty_rows[kMaxEmptyRows];
  // Where the sub-problem lies in the caller's: its first row and key, and the full extents.
  int64_t row_begin = 0, key_begin = 0, full_s_q = 0, full_s_kv = 0;
  // A variable-length call: the padded problem cuDNN is told, whose lengths and ragged offsets
  // the launch makes (ragged.hpp); the slots then hold (padded batch, h, padded seq, d) views.
  RaggedPlan ragged;
  // A paged decoding call split over its keys (split_kv.hpp): the slots of q, out, lse and the
  // lengths then describe the launch's scratch (data 0), and the launch merges into the caller's.
  SplitKv split;
  // A decoding call described by heads with sinks: folded in after cuDNN (ragged.hpp SinkFold).
  SinkFold sink_fold;
  // A one-query decoding call described by heads through a paged view: the table the launch makes.
  HeadsTable heads_table;
  // A paged step of a few queries per entry run as one-query sequences (ragged.hpp ByTokens).
  ByTokens by_tokens;
};

// Fills `plan` for a validated call (`operands` in slot order, null where absent, each 4-axis).
// Throws UnsupportedError for what the core cannot plan (sinks with rows that see no key, ...).
void plan_call(GraphOp op, const Problem& problem, const SdpaOptions& options, const TensorView* const* operands,
               int64_t cudnn_version, Plan& plan);

// Whether decoding calls get graphs that a growing cache reuses (decoding by heads, a paged
// table's bucketed width: call_plan.cpp) or graphs of their exact extents (one per cache length).
// STRIDEDFA_DECODE_GRAPHS=bucketed (the default), ragged or exact. The setters are for tests and
// benchmarks; graphs of each kind have keys of their own.
bool decode_graphs_bucketed();
void set_decode_graphs_bucketed(bool bucketed);
// Whether, bucketed, a one-query step over a head-major cache goes by heads through a paged view of
// it (plan_decode_heads_paged: the default since GPU run 66) rather than the ragged form
// (STRIDEDFA_DECODE_GRAPHS=ragged, or the setter with false).
bool decode_heads_paged();
void set_decode_heads_paged(bool paged);

// Whether a paged step of 2-4 queries per entry (2-8 for one entry) is run as one-query sequences, one per token
// (call_plan.cpp, plan_decode_by_tokens; on by default). The setter is for tests and benchmarks.
bool decode_by_tokens();
void set_decode_by_tokens(bool enabled);

// Whether a paged causal (bottom-right) step of several queries per entry over a long cache (5-8 at
// batch >= 2, 3-8 at batch >= 32) is run as a prefix every token sees, the tokens folded into the
// heads, and a tail per token, merged by their log-sum-exp (call_plan.cpp, plan_prefix_tail; on by
// default). The setter is for tests and benchmarks.
bool decode_prefix_tail();
void set_decode_prefix_tail(bool enabled);
// Whether that split describes each key head's group x tokens as cuDNN's query rows (its general
// kernel, which reads the keys once per group; the prefix cut into chunks; then 3-16 queries) rather than as
// heads of one query (off until a GPU run checks it). The setter is for tests and benchmarks.
bool decode_prefix_tail_rows();
void set_decode_prefix_tail_rows(bool enabled);
// The chunks (a power of two) such a prefix of `batch` entries x `heads_kv` key heads over a table
// declared `width` blocks wide is cut into (call_plan.cpp).
int64_t prefix_tail_chunks(int64_t batch, int64_t heads_kv, int64_t width);

// A float32 (b, h, s[, 1]) statistics view packed as cuDNN reads it before 9.12 / 9.26.
bool is_packed_stats(const TensorView& lse);

}  // namespace stridedfa
