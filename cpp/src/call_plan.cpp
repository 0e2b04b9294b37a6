#include "stridedfa/call_plan.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <iterator>
#include <string>

#include "stridedfa/errors.hpp"
#include "stridedfa/cudnn_quirks.hpp"
#include "stridedfa/memops.hpp"

namespace stridedfa {

bool is_packed_stats(const TensorView& lse) {
  const int64_t h = lse.dims[1], s = lse.dims[2];
  return (lse.dims[0] == 1 || lse.strides[0] == h * s) && (h == 1 || lse.strides[1] == s) &&
         (s == 1 || lse.strides[2] == 1);
}

namespace {

// Decoding by heads (plan_decode_by_heads) serves calls of at most this many queries (one token,
// or speculative decoding's and chunked prefill's few per step).
constexpr int64_t kDecodeMaxQueries = 16;

// STRIDEDFA_DECODE_GRAPHS, read once: exact (graphs of exact extents), ragged (by heads, always the
// ragged form) or bucketed (the default since GPU run 66: by heads, one-query steps over head-major
// caches through a paged view -- cuDNN's fast one-query kernel, 1.13-1.52x SDPA where the ragged
// form is 1.39-5.54x -- and the ragged form for the rest). -1: not read yet.
std::atomic<int> decode_bucketed{-1}, decode_paged_view{-1};

void read_decode_graphs_setting() {
  if (decode_bucketed.load(std::memory_order_acquire) >= 0) return;  // set after decode_paged_view
  const char* value = std::getenv("STRIDEDFA_DECODE_GRAPHS");
  const std::string chosen = value ? value : "";
  int unread = -1;
  decode_paged_view.compare_exchange_strong(unread, chosen == "ragged" ? 0 : 1);
  unread = -1;
  decode_bucketed.compare_exchange_strong(unread, chosen == "exact" ? 0 : 1);
}

}  // namespace

bool decode_graphs_bucketed() {
  read_decode_graphs_setting();
  return decode_bucketed.load(std::memory_order_relaxed) == 1;
}

void set_decode_graphs_bucketed(bool bucketed) {
  read_decode_graphs_setting();
  decode_bucketed.store(bucketed ? 1 : 0);
}

bool decode_heads_paged() { return decode_graphs_bucketed() && decode_paged_view.load(std::memory_order_relaxed) == 1; }

void set_decode_heads_paged(bool paged) {
  read_decode_graphs_setting();
  decode_paged_view.store(paged ? 1 : 0);
}

namespace {

// A (b, 1, 1, 1) int32 lengths operand whose memory the launch provides.
TensorView made_lengths_view(const char* name, const Problem& p) {
  TensorView t;
  t.name = name;
  t.present = true;
  t.ndim = 4;
  t.dims[0] = p.b;
  for (int i = 1; i < 4; ++i) t.dims[i] = 1;
  for (int i = 0; i < 4; ++i) t.strides[i] = 1;
  t.dtype = {kDLInt, 32, 1};
  t.device_type = kDLCUDA;
  t.device_id = p.device;
  return t;
}

// Slots point at the caller's views until the plan changes one: then the slot gets its own copy.
TensorView& set_view(Plan& plan, int slot, const TensorView& view) {
  TensorView* made = plan.views.put(slot, view);
  plan.slots[slot] = made;
  return *made;
}

void make_lengths(Plan& plan, int slot, int64_t value) {
  plan.made_lengths[slot - kSeqLensQ] = value;
  set_view(plan, slot, made_lengths_view(kOperands[slot].name, plan.problem));
}

// Every output with a token axis gets its empty sequences' rows filled after cuDNN (fill_empty_rows):
// `views` are what the launch addresses them by (the caller's, or the variable-length plan's).
void fill_empty_rows_after(GraphOp op, const TensorView* const* views, const TensorView* const* operands, Plan& plan) {
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!views[s] || role_in(op, s) != Role::output) continue;
    if (kind != OperandKind::attention && kind != OperandKind::stats) continue;
    if (plan.n_empty_rows == kMaxEmptyRows)
      throw BackendError("stridedfa: a call planned more row fills than it has room for");
    EmptyRows& e = plan.empty_rows[plan.n_empty_rows++];
    e.rows = *views[s];
    e.key_side = kOperands[s].shape[2] == kSeqKV;
    e.sink_rows = s == kLse && operands[kSinks] != nullptr;
    e.ragged_row = plan.ragged.on ? plan.ragged.row_of[s] : int8_t(-1);
  }
}

void add_fill(Plan& plan, const TensorView& region, int slot) {
  if (region.numel() == 0) return;
  if (plan.n_fills == kMaxFills) throw BackendError("stridedfa: a call planned more fills than it has room for");
  plan.fills[plan.n_fills++] = {region, kOperands[slot].kind == OperandKind::stats ? kNegativeInfinityBits : 0u};
}

// The bias as cuDNN reads it: a shared (extent-1) query axis is spelled as the full axis with
// stride 0; shared batch and head axes stay extent 1, which cuDNN broadcasts itself.
void expand_bias_rows(Plan& plan) {
  if (plan.slots[kBias]->dims[2] != 1 || plan.problem.s_q == 1) return;
  TensorView& bias = set_view(plan, kBias, *plan.slots[kBias]);
  bias.dims[2] = plan.problem.s_q;
  bias.strides[2] = 0;
}

// A score operand (bias, grad_bias) restricted to the rows and keys in `seen`, on the axes it has
// in full (a gradient summed over rows keeps its single row).
TensorView scores_restricted(const TensorView& t, const Visibility& seen, const Problem& full) {
  TensorView r = t;
  if (t.dims[2] == full.s_q) r = axis_slice(r, 2, seen.row_begin, std::max(seen.row_begin, seen.row_end));
  if (t.dims[3] == full.s_kv) r = axis_slice(r, 3, seen.key_begin, std::max(seen.key_begin, seen.key_end));
  return r;
}

// Describes only the rows and keys in `seen` and fills the outputs' regions outside it.
void restrict_to(GraphOp op, const Visibility& visible, const TensorView* const* operands, int64_t cudnn_version,
                 Plan& plan) {
  const Problem full = plan.problem;
  // With a bias' gradient every key stays: cuDNN writes dbias only packed, which a key cut would
  // break (keys no row sees take no part in the softmax, and their dbias columns come out 0).
  // Dropout draws its mask by the positions of the scores cuDNN is given, so with dropout the
  // backward cuts exactly what the forward cut (a bias' gradient that is then not packed is
  // refused by name, spec_for).
  Visibility seen = visible;
  plan.keeps_keys = operands[kGradBias] && !plan.slots[kRngState];
  if (plan.keeps_keys && !seen.empty()) {
    seen.key_begin = 0;
    seen.key_end = full.s_kv;
  }
  plan.row_begin = std::min(seen.row_begin, full.s_q);
  plan.key_begin = std::min(seen.key_begin, full.s_kv);
  plan.problem.s_q = std::max<int64_t>(seen.row_end - seen.row_begin, 0);
  plan.problem.s_kv = std::max<int64_t>(seen.key_end - seen.key_begin, 0);
  plan.nothing_for_cudnn = seen.empty();
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!operands[s] || (kind != OperandKind::attention && kind != OperandKind::stats)) continue;
    const Extent seq = kOperands[s].shape[2];
    const int64_t begin = seq == kSeqQ ? seen.row_begin : seen.key_begin;
    const int64_t end = seq == kSeqQ ? seen.row_end : seen.key_end;
    const int64_t extent = operands[s]->dims[2];
    const int64_t b = std::min(begin, extent), e = std::clamp(end, b, extent);
    if (role_in(op, s) == Role::output) {
      add_fill(plan, seq_slice(*operands[s], 0, b), s);
      add_fill(plan, seq_slice(*operands[s], e, extent), s);
    }
    set_view(plan, s, seq_slice(*operands[s], b, e));
  }
  // grad_bias is zero-filled whole before the launch (plan_call): only the views change here. A
  // slice that starts off a 16-byte boundary would fault cuDNN's loads: refused instead.
  for (int s : {kBias, kGradBias}) {
    if (!plan.slots[s]) continue;
    const TensorView& cut = set_view(plan, s, scores_restricted(*plan.slots[s], seen, full));
    if (cut.data % 16 != 0 && !plan.nothing_for_cudnn && cut.numel() != 0) {
      throw UnsupportedError(std::string(kOperands[s].name) + ": the mask leaves rows or keys out (rows " +
                             std::to_string(seen.row_begin) + ".., keys " + std::to_string(seen.key_begin) +
                             "..), and the part of the bias cuDNN would read then starts off a 16-byte boundary. "
                             "Give the bias rows of a multiple of 8 elements, or fold this mask into the bias.");
    }
  }
  // A row slice of the caller's statistics may be misaligned (rows of 4 bytes) or, before cuDNN
  // 9.12 (forward) / 9.26 (backward), not packed enough for cuDNN: it then goes through a packed,
  // aligned staging buffer (copied in before a backward, out after a forward).
  if (!operands[kLse] || plan.slots[kLse]->dims[2] == operands[kLse]->dims[2]) return;
  const TensorView& sliced = *plan.slots[kLse];
  const int64_t packed_since = op == GraphOp::backward ? 92600 : 91200;
  const bool old_cudnn_needs_packed = cudnn_version < packed_since && !is_packed_stats(sliced);
  if (sliced.data % 16 == 0 && !old_cudnn_needs_packed) return;
  plan.stage_lse = true;
  plan.lse_source = sliced;
  set_view(plan, kLse, packed_like(plan.lse_source, 0));  // its pointer is set at launch
}

// cuDNN's backward refuses s_q = s_kv = 1, whose gradients are exact without it: one key gets all
// the weight (P = 1 whatever the scores), so dQ = dK = 0 and dV = dO. With grouped heads dV sums
// dO over each group: the g query heads sharing a kv head are then described as g query rows of
// one head (a view: their seq axis is the heads' stride), which cuDNN's backward runs.
// With one key the bias' gradient is zero (filled by plan_call), and ALiBi's distance is 0. The bias
// stays: cuDNN computes P = exp(S - lse) from the forward's lse, which includes it.
void one_query_one_key_backward(Plan& plan) {
  Problem& p = plan.problem;
  if (plan.slots[kRngState]) {  // which of the one key's weights were dropped only cuDNN knows
    throw UnsupportedError(
        "the backward with s_q = s_kv = 1 (after the mask) and dropout is not supported: cuDNN refuses "
        "s_q = s_kv = 1, and the dropped weights are known only to its generator; use dropout_p=0 here.");
  }
  plan.slots[kGradBias] = plan.slots[kAlibiSlopes] = nullptr;
  if (plan.slots[kSinks]) {
    throw UnsupportedError(
        "the backward with s_q = s_kv = 1 and attention sinks is not supported (cuDNN refuses "
        "s_q = s_kv = 1 with a sink token).");
  }
  if (p.h_q == p.h_kv) {
    plan.nothing_for_cudnn = true;
    add_fill(plan, *plan.slots[kGradQ], kGradQ);
    add_fill(plan, *plan.slots[kGradK], kGradK);
    plan.copies[plan.n_copies++] = {*plan.slots[kGradO], *plan.slots[kGradV]};
    return;
  }
  const int64_t group = p.h_q / p.h_kv;
  for (int s = 0; s < kNumSlots; ++s) {
    if (!plan.slots[s] || kOperands[s].shape[1] != kHeadsQ) continue;
    TensorView& t = set_view(plan, s, *plan.slots[s]);
    if (s == kBias && t.dims[1] == 1) {  // the folded rows would share it: cuDNN misreads that
      throw UnsupportedError(
          "the backward with s_q = s_kv = 1, grouped heads and a bias shared by the heads is not supported "
          "(cuDNN runs it only with the group's query heads as rows, which would then share the bias); pass the "
          "bias with one value per query head, e.g. bias.expand(-1, h_q, -1, -1).contiguous().");
    }
    t.strides[2] = t.strides[1];
    t.strides[1] *= group;
    t.dims[1] = p.h_kv;
    t.dims[2] = group;
  }
  p.h_q = p.h_kv;
  p.s_q = group;
  plan.unmasked = true;  // every row of the fold sees the one key, whatever the mask said
}

// Whether, with each sequence's keys decided by padding lengths (at most s_kv of them, at most s_q
// queries), a query at the end of its sequence sees all of them: no top-left diagonal cuts the
// newest, no left bound the oldest. A window at least as wide as the keys cuts none: a
// sliding-window model decoding inside its window (transformers' sliding caches keep no more keys
// than the window), which then runs on cuDNN's fast one-query kernel like a full-attention layer.
bool last_row_sees_every_key(const SdpaOptions& options, int64_t s_q, int64_t s_kv) {
  if (options.right_bound() != SdpaOptions::kUnbounded && options.alignment != CausalAlignment::bottom_right)
    return false;
  if (options.left_bound() == SdpaOptions::kUnbounded) return true;
  const int64_t last_row = options.alignment == CausalAlignment::bottom_right ? s_kv - 1 : s_q - 1;
  return last_row - options.left_bound() <= 0;
}

// One query row that sees every key of its (sub-)problem needs no mask, and cuDNN runs a one-row
// graph over a dense or paged cache with its fast decoding kernel only when it has none (padding
// lengths allowed): with a causal mask the same call takes the general kernel, 9x slower at 8k keys
// (GPU run 64: a paged b1 x 8k step 180 -> 19 µs, a dense one at 7,000 keys 111 -> 12 µs). Without
// lengths, restrict_to has already cut the keys to the interval the row sees; with them, the row
// sees all of its sequence's keys unless a left bound cuts the oldest or a top-left diagonal the
// newest. ALiBi's distances and dropout's mask follow the indices cuDNN sees: they keep the mask.
void one_row_sees_every_key(GraphOp op, const SdpaOptions& options, bool has_lengths, Plan& plan) {
  if (op != GraphOp::forward || plan.nothing_for_cudnn || plan.problem.s_q != 1) return;
  if (plan.slots[kAlibiSlopes] || plan.slots[kRngState]) return;
  if (has_lengths && !last_row_sees_every_key(options, plan.problem.s_q, plan.problem.s_kv)) return;
  plan.unmasked = true;
}

// Quirk sinks_with_one_query: cuDNN refuses attention sinks with one query row ("decode only mode
// ... not supported with sink_token"): every decoding step of a model with sinks (gpt-oss). Under a mask that leaves
// the one row all of the sub-problem's keys, the row is described twice -- q, out and lse get a query axis of 2 with
// stride 0 -- so that cuDNN computes the same row twice and writes the same bytes to the same place: no copy, the
// numbers of the one-row call. The core's own lengths then say 2 rows; the caller's seqlens_q still decide the empty
// rows' fill (fill_empty_rows).
void one_query_with_sinks(GraphOp op, const SdpaOptions& options, bool has_lengths, Plan& plan) {
  if (op != GraphOp::forward || !plan.slots[kSinks] || plan.nothing_for_cudnn || plan.problem.s_q != 1) return;
  if (!quirk_applies(Quirk::sinks_with_one_query)) return;
  const char* why = nullptr;
  if (plan.slots[kAlibiSlopes]) why = "ALiBi (its distance differs between the two rows)";
  if (plan.slots[kRngState]) why = "dropout (its mask differs between the two rows)";
  if (has_lengths) {
    // The padding mask stays; a causal bottom-right diagonal shows the one row every real key.
    const bool band = options.left_bound() != SdpaOptions::kUnbounded ||
                      (options.right_bound() != SdpaOptions::kUnbounded && !options.causal);
    if (band || (options.causal && options.alignment != CausalAlignment::bottom_right)) {
      why = "padding lengths and a window or a top-left causal mask (the two rows would see different keys)";
    }
  }
  if (why) {
    throw UnsupportedError(std::string("attention sinks with a single query row and ") + why +
                           " are not supported: cuDNN refuses sinks with s_q = 1, which stridedfa runs as the one row "
                           "described twice. Drop that option for decoding, or pass no padding lengths.");
  }
  plan.unmasked = true;  // the row sees every key the plan kept (or, with lengths, every real key)
  plan.problem.s_q = 2;
  for (int s : {kQ, kO, kLse, kBias}) {
    if (!plan.slots[s] || (s == kBias && plan.slots[s]->dims[2] != 1)) continue;
    TensorView& twice = set_view(plan, s, *plan.slots[s]);
    twice.dims[2] = 2;
    twice.strides[2] = 0;
  }
  if (has_lengths) make_lengths(plan, kSeqLensQ, 2);
}

// A variable-length call (ragged.hpp): cuDNN computes the padded (sequences, h, max, d) problem
// from the caller's tensors through ragged offsets; the outputs are zeroed (lse -inf) first, so
// that tokens in no sequence, and sequences cuDNN writes nothing for, hold defined values.
void plan_ragged(GraphOp op, const SdpaOptions& options, const TensorView* const* operands, int64_t cudnn_version,
                 Plan& plan) {
  const Problem full = plan.problem;  // one batch entry; s_q, s_kv: the token counts
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    const bool token_axis = kind == OperandKind::attention || kind == OperandKind::stats;
    if (operands[s] && token_axis && role_in(op, s) == Role::output) add_fill(plan, *operands[s], s);
  }
  if (full.sequences == 0 || full.s_q == 0 || full.s_kv == 0) {  // no query or key: the fills are the answer
    plan.nothing_for_cudnn = true;
    return;
  }
  if (op == GraphOp::backward && operands[kSinks] && quirk_applies(Quirk::varlen_backward_sinks, cudnn_version)) {
    throw UnsupportedError(
        "attention sinks in a variable-length backward need cuDNN 9.26 or newer (earlier versions read out of "
        "bounds there); this process runs cuDNN " +
        std::to_string(cudnn_version / 10000) + "." + std::to_string(cudnn_version / 100 % 100) +
        " (fixed sinks too). Use padded tensors with seqlens_q / seqlens_kv, or no sinks in training." +
        quirk_tag(Quirk::varlen_backward_sinks));
  }
  RaggedPlan& r = plan.ragged;
  r.on = true;
  r.sequences = full.sequences;
  r.padded_sequences = length_bucket(full.sequences);
  r.total_q = full.s_q;
  r.total_kv = full.s_kv;
  // The longest sequence: the caller's promise (max_seqlen_*) where it is tighter than the tokens.
  const auto longest = [](int64_t promised, int64_t tokens) {
    return promised > 0 ? std::min(promised, tokens) : tokens;
  };
  r.max_q = length_bucket(longest(options.max_seqlen_q, full.s_q));
  r.max_kv = length_bucket(longest(options.max_seqlen_kv, full.s_kv));
  const int64_t decode_kv = power_of_two_bucket(longest(options.max_seqlen_kv, full.s_kv), 128);
  if (op == GraphOp::forward && decode_graphs_bucketed() && !(options.dropout_p > 0) &&
      longest(options.max_seqlen_q, full.s_q) <= kDecodeMaxQueries && full.s_kv > full.s_q &&
      r.padded_sequences * decode_kv <= INT32_MAX) {
    // A variable-length decoding step (a few queries per sequence against longer caches): the keys'
    // extent a power of two and the totals stepping with it, so growing caches build one graph per
    // doubling instead of four (and another whenever the key total crosses a bucket of its own).
    // Not with dropout, whose mask follows the declared extent, which the backward would not share.
    r.max_kv = decode_kv;
    r.totals_from_extents = true;
  }
  r.cu_q = operands[kCuSeqlensQ]->data;
  r.cu_kv = operands[kCuSeqlensKV]->data;
  std::fill(std::begin(r.row_of), std::end(r.row_of), int8_t(-1));
  plan.problem.b = r.padded_sequences;
  plan.problem.s_q = r.max_q;
  plan.problem.s_kv = r.max_kv;
  const int64_t group = full.h_kv > 0 ? full.h_q / full.h_kv : 1;
  if (op == GraphOp::backward && full.h_kv == 1 && group > 1 && quirk_applies(Quirk::varlen_backward_mqa_dk)) {
    // Quirk varlen_backward_mqa_dk: every MQA case computed a wrong dK, at every layout, while GQA
    // with two or more key/value heads was right.
    throw UnsupportedError(
        "grad_k: cuDNN 9.19's variable-length backward computes a wrong dK when one key/value head serves " +
        std::to_string(full.h_q) +
        " query heads (MQA). Repeat k and v to two heads (k.expand(-1, 2, -1).contiguous(), "
        "grouped-query attention) and sum their two gradients; stridedfa.torch, stridedfa.cupy and "
        "stridedfa.jax do so themselves." +
        quirk_tag(Quirk::varlen_backward_mqa_dk));
  }
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!operands[s] || (kind != OperandKind::attention && kind != OperandKind::stats)) continue;
    const TensorView& given = *operands[s];
    const bool key_side = kOperands[s].shape[2] == kSeqKV;
    // A token axis of extent 1 carries any stride; its only sequence start past 0 is its end.
    const int64_t token_stride = given.dims[2] > 1 ? given.strides[2] : given.dims[1] * given.dims[3];
    if (op == GraphOp::backward && group > 1 && (s == kGradK || s == kGradV)) {
      // cuDNN sums grouped heads from a workspace laid out like the gradient with every stride of
      // the token axis scaled by the group: only a token-major gradient keeps that layout apart.
      const int64_t heads = given.dims[1] > 1 ? given.strides[1] * given.dims[1] : given.dims[3];
      if (given.dims[1] > 1 && (given.strides[1] < given.dims[3] || token_stride < heads)) {
        throw UnsupportedError(std::string(given.name) +
                               ": with grouped heads cuDNN's variable-length backward needs the gradient token-major "
                               "(each token's heads together: token stride >= heads x head stride); this one has "
                               "head stride " +
                               std::to_string(given.strides[1]) + " and token stride " + std::to_string(token_stride) +
                               ". Allocate it as (tokens, heads, head_dim).");
      }
    }
    const uint32_t row = uint32_t(token_stride) | (key_side ? 0x80000000u : 0u);
    int index = 0;
    while (index < r.n_rows && r.rows[index] != row) ++index;
    if (index == r.n_rows) r.rows[r.n_rows++] = row;
    r.row_of[s] = int8_t(index);
    TensorView& view = set_view(plan, s, given);
    view.dims[0] = r.padded_sequences;
    view.dims[2] = key_side ? r.max_kv : r.max_q;
    view.strides[2] = token_stride;
    // cuDNN steps between sequences by the ragged offsets; the batch stride is the padded layout's
    // (16-byte aligned, as it checks), never used to address.
    view.strides[0] = (view.dims[2] * token_stride + 7) / 8 * 8;
  }
  for (int s : {kSeqLensQ, kSeqLensKV}) {
    TensorView& lengths = set_view(plan, s, made_lengths_view(kOperands[s].name, plan.problem));
    lengths.data = 0;  // the launch's buffer
  }
  // A sequence with queries but no keys: cuDNN computes 0/0 in its rows (GPU run 53).
  fill_empty_rows_after(op, plan.slots, operands, plan);
  plan.slots[kCuSeqlensQ] = plan.slots[kCuSeqlensKV] = nullptr;  // read by the kernel, not by cuDNN
}

// Decoding by heads through a paged view (the default; issue 33 item 1). The ragged form
// (plan_decode_by_heads, below) takes cuDNN 9.19's general kernel (GPU run 64); its fast one-query kernel runs
// dense and paged layouts. A head-major cache -- each head's tokens whole rows apart, heads and
// batch entries a whole number of rows apart, as transformers' dynamic cache has it -- is a paged
// cache of one-token blocks: each (batch entry, key/value head) one sequence whose table lists its
// head's rows (made at launch: stridedfa_heads_table), its query heads the sequence's heads. The
// graph then holds the token stride, the keys' extent as a power of two and the cache's rows as a
// power of two: nothing that grows with every step. One query, no sinks or caller's lengths.
bool plan_decode_heads_paged(const Problem& p, const SdpaOptions& options, const TensorView* const* operands,
                             Plan& plan) {
  if (!decode_heads_paged() || p.s_q != 1 || p.h_q < 2 || operands[kSinks] || operands[kSeqLensKV]) return false;
  if (!last_row_sees_every_key(options, p.s_q, p.s_kv)) return false;  // the lengths are then its whole mask
  const TensorView& k = *operands[kK];
  const TensorView& v = *operands[kV];
  const int64_t group = p.h_q / p.h_kv;
  int64_t rows[2][2];  // (k, v) x (batch, head): whole rows of each cache apart
  const TensorView* caches[2] = {&k, &v};
  for (int c = 0; c < 2; ++c) {
    const TensorView& t = *caches[c];
    const int64_t row = t.strides[2];
    if (row <= 0 || t.strides[3] != 1) return false;
    const int64_t batch = p.b > 1 ? t.strides[0] : 0, head = p.h_kv > 1 ? t.strides[1] : 0;
    if (batch < 0 || head < 0 || batch % row != 0 || head % row != 0) return false;
    rows[c][0] = batch / row;
    rows[c][1] = head / row;
  }
  if (rows[0][0] != rows[1][0] || rows[0][1] != rows[1][1]) return false;  // one table for both
  const int64_t cache_rows = (p.b - 1) * rows[0][0] + (p.h_kv - 1) * rows[0][1] + p.s_kv;
  if (cache_rows > (int64_t(1) << 30)) return false;  // its declared power of two an int32 too
  // q, out and lse: each batch entry's heads in a row of equal steps (the group's heads one
  // sequence's), as (b, h, s, d) and (b, s, h, d) views of one token have them.
  for (int s : {kQ, kO, kLse}) {
    if (!operands[s]) continue;
    const TensorView& t = *operands[s];
    if (t.strides[1] <= 0 || (p.b > 1 && t.strides[0] != p.h_q * t.strides[1])) return false;
  }
  const int64_t sequences = p.b * p.h_kv;
  const int64_t width = power_of_two_bucket(p.s_kv, 128);
  if (sequences * width > INT32_MAX) return false;  // the kernel's entries (a broadcast cache: few rows)
  HeadsTable& table = plan.heads_table;
  table.on = true;
  table.rows = sequences;
  table.width = width;
  table.heads_kv = p.h_kv;
  table.batch_rows = rows[0][0];
  table.head_rows = rows[0][1];
  table.length = p.s_kv;
  table.num_blocks = cache_rows;
  plan.problem.b = sequences;
  plan.problem.h_q = group;
  plan.problem.h_kv = 1;
  plan.problem.s_kv = width;
  plan.problem.paged = true;
  plan.problem.block_size = 1;
  plan.problem.blocks = width;
  plan.problem.num_blocks = power_of_two_bucket(cache_rows, 1024);  // declared: what the ids may reach
  plan.unmasked = true;  // the one query sees all its head's keys: the lengths are the whole mask
  for (int s : {kQ, kO, kLse}) {
    if (!operands[s]) continue;
    const TensorView& given = *operands[s];
    TensorView& view = set_view(plan, s, given);
    const int64_t head = given.strides[1];
    view.dims[0] = sequences;
    view.dims[1] = group;
    view.dims[2] = 1;
    view.strides[0] = group * head;
    view.strides[1] = head;
    view.strides[2] = group * head;  // one token: any stride; described as following the heads
  }
  for (int s : {kK, kV}) {
    const TensorView& given = *operands[s];
    TensorView& view = set_view(plan, s, given);
    const int64_t row = given.strides[2];
    view.dims[0] = plan.problem.num_blocks;
    view.dims[1] = 1;
    view.dims[2] = 1;
    view.strides[0] = row;
    view.strides[1] = row;
    view.strides[2] = row;
  }
  TensorView made_table;
  made_table.name = kOperands[kBlockTable].name;
  made_table.present = true;
  made_table.ndim = 4;
  made_table.dtype = DLDataType{kDLInt, 32, 1};
  made_table.device_type = kDLCUDA;
  made_table.device_id = p.device;
  made_table.data = 0;  // the launch's scratch
  made_table.dims[0] = sequences;
  made_table.dims[1] = 1;
  made_table.dims[2] = width;
  made_table.dims[3] = 1;
  made_table.strides[0] = width;
  made_table.strides[1] = width;
  made_table.strides[2] = 1;
  made_table.strides[3] = 1;
  set_view(plan, kBlockTable, made_table);
  make_lengths(plan, kSeqLensQ, 1);
  make_lengths(plan, kSeqLensKV, p.s_kv);
  return true;
}

// Whether the call has an operand that a decoding rewrite (its rows regrouped, cut into chunks or
// repeated per token) cannot carry: a bias has the key extent, ALiBi's slopes follow the query heads,
// the caller's query lengths would leave rows the rewrite does not fill, dropout's state its offsets.
bool has_operand_a_rewrite_cannot_carry(const TensorView* const* operands) {
  for (int s : {kBias, kAlibiSlopes, kSeqLensQ, kRngState}) {
    if (operands[s]) return true;
  }
  return false;
}

// Decoding by heads: a call of a few queries against a cache whose length L changes every step
// would build a cuDNN graph per L (40-160 ms each), because the graph holds the extents and, for a
// head-major cache, the batch and head strides (which grow with L). Instead every (batch entry i,
// key/value head j) becomes one sequence of a ragged problem -- its group of h_q / h_kv query heads
// that sequence's heads, its keys one head -- that starts at i * batch stride + j * head stride
// (computed on the device at launch: stridedfa_heads_offsets) and has L keys. The graph then holds
// only the token and in-group head strides and bucketed extents (the keys' a power of two), so a
// decoding loop builds one graph per doubling of its cache. Returns false, leaving `plan` as it
// was, for a call this does not describe (a backward, anything with a per-head or per-key operand,
// dropout, offsets beyond 31 bits, or decode graphs not bucketed: decode_graphs_bucketed()).
bool plan_decode_by_heads(GraphOp op, const Problem& p, const SdpaOptions& options, const TensorView* const* operands,
                          const Visibility& seen, int64_t cudnn_version, Plan& plan) {
  if (op != GraphOp::forward || p.ragged || p.paged || !decode_graphs_bucketed()) return false;
  if (p.s_q > kDecodeMaxQueries || p.s_kv <= p.s_q || p.s_q == 0 || p.h_kv == 0) return false;  // a cache
  if (cudnn_version < 91801) return false;  // cuDNN's ragged layout on every compute capability
  if (options.dropout_p > 0) return false;  // its mask would follow the declared extents
  // (Sinks it carries: they are folded in after cuDNN, SinkFold.)
  if (has_operand_a_rewrite_cannot_carry(operands)) return false;
  // The keys' lengths only where each sequence's one row then sees every real key, and not with
  // sinks (an empty sequence's fills would go to the statistics the fold reads, not the caller's).
  if (operands[kSeqLensKV] && (p.s_q != 1 || operands[kSinks])) return false;
  if (seen.row_begin != 0 || seen.row_end != p.s_q) return false;  // every row sees a key: no fills
  if (plan_decode_heads_paged(p, options, operands, plan)) return true;
  // With sinks and no lse asked for, the statistics the fold reads go to a packed scratch.
  const TensorView* given_operands[kNumSlots];
  std::copy(operands, operands + kNumSlots, given_operands);
  TensorView scratch_lse;
  if (operands[kSinks] && !operands[kLse]) {
    scratch_lse = *operands[kO];
    scratch_lse.name = kOperands[kLse].name;
    scratch_lse.data = 0;  // the launch's scratch
    scratch_lse.dtype = DLDataType{kDLFloat, 32, 1};
    scratch_lse.dims[3] = 1;
    scratch_lse.strides[3] = 1;
    scratch_lse.strides[2] = 1;
    scratch_lse.strides[1] = p.s_q;
    scratch_lse.strides[0] = p.h_q * p.s_q;
    given_operands[kLse] = &scratch_lse;
  }
  operands = given_operands;
  const int64_t group = p.h_q / p.h_kv;
  const int64_t sequences = p.b * p.h_kv;
  RaggedPlan r;
  r.on = r.by_heads = r.totals_from_extents = true;
  r.sequences = sequences;
  r.padded_sequences = length_bucket(sequences);
  r.heads_kv = p.h_kv;
  r.len_q = r.total_q = p.s_q;
  r.len_kv = r.total_kv = p.s_kv;
  r.max_q = length_bucket(p.s_q);
  r.max_kv = power_of_two_bucket(p.s_kv, 128);
  if (operands[kSeqLensKV]) {
    const TensorView& given = *operands[kSeqLensKV];
    r.callers_kv = {given.data, given.dims[0] > 1 ? given.strides[0] : 1};
  }
  std::fill(std::begin(r.row_of), std::end(r.row_of), int8_t(-1));
  TensorView declared[kNumSlots];
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!operands[s] || (kind != OperandKind::attention && kind != OperandKind::stats)) continue;
    const TensorView& given = *operands[s];
    const bool key_side = kOperands[s].shape[2] == kSeqKV;
    const int64_t heads = key_side ? 1 : group;
    const int64_t batch_stride = given.dims[0] > 1 ? given.strides[0] : 0;
    const int64_t head_stride = given.dims[1] > 1 ? given.strides[1] : given.dims[2] * given.dims[3];
    const int64_t group_stride = head_stride * heads;  // from one sequence's heads to the next's
    // The offsets must not decrease from one sequence to the next (as cu_seqlens' do): batch
    // entries outside their heads, as every (b, h, s, d) and (b, s, h, d) layout has them.
    if (batch_stride < 0 || head_stride < 0 || (p.b > 1 && batch_stride < p.h_kv * group_stride)) return false;
    // The largest offset, the end of the last sequence (written for the padding ones), in int32.
    const int64_t end = (p.b - 1) * batch_stride + p.h_kv * group_stride;
    if (end > INT32_MAX) return false;
    // A token axis of extent 1 carries any stride: described as following the heads.
    const int64_t token_stride = given.dims[2] > 1 ? given.strides[2] : heads * head_stride;
    // What the offsets reach, past the last element cuDNN reads (the caller's extents).
    const int64_t reach =
        end - group_stride + (heads - 1) * head_stride + (given.dims[2] - 1) * token_stride + given.dims[3];
    int index = 0;
    while (index < r.n_rows &&
           !(r.rows[index] == uint32_t(batch_stride) && r.head_strides[index] == uint32_t(group_stride))) {
      ++index;
    }
    if (index == kMaxHeadsRows) return false;
    if (index == r.n_rows) {
      r.rows[r.n_rows] = uint32_t(batch_stride);
      r.head_strides[r.n_rows++] = uint32_t(group_stride);
    }
    r.row_of[s] = int8_t(index);
    TensorView& view = declared[s] = given;
    view.dims[0] = r.padded_sequences;
    view.dims[1] = heads;
    view.dims[2] = key_side ? r.max_kv : r.max_q;
    view.strides[1] = heads > 1 ? head_stride : view.dims[2] * token_stride;
    view.strides[2] = token_stride;
    // cuDNN steps between sequences by the offsets; the batch stride is the padded layout's
    // (16-byte aligned, as it checks), never used to address -- but the declared tensor covers
    // all that the offsets reach (a static cache's heads lie a capacity apart): a power of two
    // where the padded layout falls short, so that the key stays put while the cache grows.
    int64_t batch_extent = heads * view.dims[2] * token_stride;
    if (r.padded_sequences * batch_extent < reach) {
      batch_extent = power_of_two_bucket((reach + r.padded_sequences - 1) / r.padded_sequences, 8);
    }
    view.strides[0] = (batch_extent + 7) / 8 * 8;
  }
  plan.ragged = r;
  for (int s = 0; s < kNumSlots; ++s) {
    if (plan.ragged.row_of[s] >= 0) set_view(plan, s, declared[s]);
  }
  plan.problem.b = r.padded_sequences;
  plan.problem.h_q = group;
  plan.problem.h_kv = 1;
  plan.problem.s_q = r.max_q;
  plan.problem.s_kv = r.max_kv;
  for (int s : {kSeqLensQ, kSeqLensKV}) {
    TensorView& lengths = set_view(plan, s, made_lengths_view(kOperands[s].name, plan.problem));
    lengths.data = 0;  // the launch's buffer
  }
  // A sequence of no keys (the caller's length 0): cuDNN computes 0/0 in its row.
  if (operands[kSeqLensKV]) fill_empty_rows_after(op, plan.slots, operands, plan);
  if (operands[kSinks]) {
    SinkFold& fold = plan.sink_fold;
    fold.on = true;
    fold.sinks = operands[kSinks]->data;
    fold.sinks_stride = operands[kSinks]->dims[1] > 1 ? operands[kSinks]->strides[1] : 1;
    fold.out = *operands[kO];
    if (operands[kLse] != &scratch_lse) fold.lse = *operands[kLse];
    fold.scratch_elements = p.b * p.h_q * p.s_q + r.max_q * p.h_q;
    fold.bf16 = p.dtype.code == kDLBfloat;
    plan.slots[kSinks] = nullptr;  // the fold's, not cuDNN's
  }
  return true;
}

// What every split of a paged decoding call (split-KV, a prefix + tail) says alike: its extents, the
// caller's q, out and lse the launch reads and the merge writes, and the sinks, which the merge weighs
// in (a score with no value per head), so cuDNN must not.
SplitKv& start_split(const Problem& p, const TensorView* const* operands, int64_t chunks, int64_t heads, Plan& plan) {
  SplitKv& split = plan.split;
  split.on = true;
  split.batch = p.b;
  split.chunks = chunks;
  split.heads = heads;
  split.d_qk = p.d_qk;
  split.d_v = p.d_v;
  split.full_len = p.s_kv;
  split.bf16 = p.dtype.code == kDLBfloat;
  split.q = *operands[kQ];
  split.out = *operands[kO];
  if (operands[kLse]) split.lse = *operands[kLse];
  if (operands[kSinks]) {
    split.sinks = operands[kSinks]->data;
    split.sinks_stride = operands[kSinks]->dims[1] > 1 ? operands[kSinks]->strides[1] : 1;
    plan.slots[kSinks] = nullptr;
  }
  return split;
}

// A split's scratch as cuDNN reads it, packed (sequences, split.heads, d) -- described as
// (sequences, heads / rows, rows, d) queries and partial outputs, (sequences, heads / rows, rows, 1)
// float32 statistics, rows = split.rows -- and the made lengths; every row sees all its sequence's
// keys, so the padding mask is the whole mask. plan.problem's batch is the split's sequences first.
void describe_split_scratch(const Problem& p, const TensorView* const* operands, Plan& plan) {
  const int64_t sequences = plan.split.sequences(), heads = plan.split.heads, rows = plan.split.rows;
  plan.problem.b = sequences;
  plan.unmasked = true;
  const auto packed = [&](int slot, const TensorView& like, int64_t inner, DLDataType dtype) {
    TensorView& view = set_view(plan, slot, like);
    view.data = 0;  // the launch's scratch
    view.present = true;
    view.dtype = dtype;
    view.dims[0] = sequences;
    view.dims[1] = heads / rows;
    view.dims[2] = rows;
    view.dims[3] = inner;
    view.strides[3] = 1;
    view.strides[2] = inner;
    view.strides[1] = rows * inner;
    view.strides[0] = heads * inner;
  };
  packed(kQ, *operands[kQ], p.d_qk, p.dtype);
  packed(kO, *operands[kO], p.d_v, p.dtype);
  TensorView stats = *operands[kO];
  stats.name = kOperands[kLse].name;
  packed(kLse, stats, 1, DLDataType{kDLFloat, 32, 1});
  for (int s : {kSeqLensQ, kSeqLensKV}) {
    TensorView& lengths = set_view(plan, s, made_lengths_view(kOperands[s].name, plan.problem));
    lengths.data = 0;  // the launch's scratch
  }
}

// Split-KV decoding of a paged cache (split_kv.hpp): one query per sequence, so that every chunk's
// row sees all of its keys whatever the chunk (no band that a chunk would misplace, no operand per
// key that a chunk would need cut; sinks are the merge's). Returns false, leaving `plan` as it was, for a call
// it does not describe or that already fills the GPU (split_kv_chunks: 1).
bool plan_split_kv(GraphOp op, const Problem& p, const SdpaOptions& options, const TensorView* const* operands,
                   Plan& plan) {
  if (op != GraphOp::forward || !p.paged || p.s_q != 1 || !split_kv_enabled()) return false;
  if (has_operand_a_rewrite_cannot_carry(operands)) return false;
  if (!last_row_sees_every_key(options, p.s_q, p.s_kv)) return false;  // every chunk's row sees all its keys
  const TensorView table = *plan.slots[kBlockTable];                   // its declared (possibly bucketed) width
  const int64_t width = table.dims[2];
  const int64_t chunks = std::min(split_kv_chunks(p.b, p.h_q, width * p.block_size), width);
  if (chunks < 2) return false;
  SplitKv& split = start_split(p, operands, chunks, p.h_q, plan);
  split.blocks_per_chunk = (width + chunks - 1) / chunks;
  split.keys_per_chunk = split.blocks_per_chunk * p.block_size;
  plan.problem.blocks = split.blocks_per_chunk;
  plan.problem.s_kv = split.keys_per_chunk;
  describe_split_scratch(p, operands, plan);
  // The table's packed copy read as (sequences, 1, blocks_per_chunk, 1): the entries' rows in pieces.
  TensorView& split_table = set_view(plan, kBlockTable, table);
  split_table.dims[0] = split.sequences();
  split_table.dims[2] = split.blocks_per_chunk;
  split_table.strides[0] = split.blocks_per_chunk;
  split_table.strides[2] = 1;
  return true;
}

// Decoding by tokens (issue 33 item 3; docs/design/multi-token-decode.md). A paged step of a few
// queries per entry (speculative decoding, chunked prefill) takes cuDNN 9.19's general kernel, one
// thread block per (entry, head) through all the keys, masked or not; one query takes its fast
// decoding kernel. Under a bottom-right causal mask query t of entry i sees exactly the first
// L_i - s_q + 1 + t keys -- a padding length, not a mask -- and without a mask all L_i: so each
// (entry, token) becomes a one-query sequence of its own, with nothing to merge. q, out and lse are
// read as (b x s_q, h, 1, d), which needs the token axis inside the entry's (batch stride = s_q
// token strides, as a (b, s, h, d) projection's view has it); the launch's table copy repeats each
// entry's row s_q times and makes the key lengths (ragged.hpp ByTokens). Each token rereads its
// entry's keys, so it pays only for few tokens, or few sequences in all. GPU runs 66-67 (H100, 1k-8k
// keys; probe66/67, bench_paged): up to 4 tokens faster than the general kernel at every batch (2
// tokens at b32 x 8k 416 against 1,092 µs, 4: 600 against 1,102); at batch 1 up to 8 (51 against
// 149); 6 and 8 tokens at batch 8 slower (300 against 285).
constexpr int64_t kByTokensMaxQueries = 4, kByTokensMaxQueriesOneEntry = 8;
std::atomic<bool> by_tokens_enabled{true};

bool plan_decode_by_tokens(GraphOp op, const Problem& p, const SdpaOptions& options, const TensorView* const* operands,
                           int64_t cudnn_version, Plan& plan) {
  if (op != GraphOp::forward || !p.paged || p.s_q < 2) return false;
  if (p.s_q > (p.b == 1 ? kByTokensMaxQueriesOneEntry : kByTokensMaxQueries)) return false;
  if (!by_tokens_enabled.load(std::memory_order_relaxed)) return false;
  if (has_operand_a_rewrite_cannot_carry(operands) || operands[kSinks]) return false;
  if (options.left_bound() != SdpaOptions::kUnbounded) return false;
  const bool causal = options.right_bound() != SdpaOptions::kUnbounded;
  if (causal && (options.right_bound() != 0 || options.alignment != CausalAlignment::bottom_right)) return false;
  for (int s : {kQ, kO, kLse}) {
    if (operands[s] && p.b > 1 && operands[s]->strides[0] != p.s_q * operands[s]->strides[2]) return false;
  }
  // cuDNN before 9.12 writes only packed statistics, which the tokens' view of lse is not.
  if (operands[kLse] && cudnn_version < 91200) return false;
  const int64_t sequences = p.b * p.s_q;
  const int64_t width = plan.slots[kBlockTable]->dims[2];  // the declared (bucketed) width
  if (sequences * width > INT32_MAX) return false;         // the kernel's entries
  ByTokens& tokens = plan.by_tokens;
  tokens.on = true;
  tokens.queries = p.s_q;
  tokens.causal = causal;
  tokens.full_len = p.s_kv;
  plan.problem.b = sequences;
  plan.problem.s_q = 1;
  plan.unmasked = true;  // each sequence's one query sees all of its keys: the lengths are the mask
  for (int s : {kQ, kO, kLse}) {
    if (!operands[s]) continue;
    TensorView& view = set_view(plan, s, *operands[s]);
    view.dims[0] = sequences;
    view.dims[2] = 1;
    view.strides[0] = operands[s]->strides[2];
  }
  TensorView& table = set_view(plan, kBlockTable, *plan.slots[kBlockTable]);
  table.dims[0] = sequences;
  make_lengths(plan, kSeqLensQ, 1);
  TensorView& lengths = set_view(plan, kSeqLensKV, made_lengths_view(kOperands[kSeqLensKV].name, plan.problem));
  lengths.data = 0;  // the launch's, beside the table copy
  // A token whose length is 0 (L_i < s_q - t): cuDNN computes 0/0 in its row.
  fill_empty_rows_after(op, plan.slots, operands, plan);
  return true;
}

// A prefix and a tail (issue 33 item 3; docs/design/multi-token-decode.md): by tokens rereads the
// keys once per token, so past 4 tokens it loses to cuDNN's general kernel (~30% of the copy
// ceiling). Under a bottom-right causal mask every token of an entry with L keys sees its first
// L - s_q + 1; so split each entry's keys at P = floor(max(L - s_q, 0) / block) x block (a block
// boundary, at most L - s_q): the prefix [0, P), which every token sees -- the tokens folded into
// the query heads (h_q x s_q heads, head-major), one query, unmasked: cuDNN's fast one-query kernel
// reads the keys once for all of them -- and token t's tail [P, L - s_q + 1 + t), at most s_q + block
// - 1 keys. Both are sequences of one paged graph: entry i's chunk 0 its prefix, chunk 1 + t token
// t's tail (its table row the entry's, shifted to P by the launch's table copy; every folded head
// runs there, only token t's are merged), then each row merged from its two chunks by their
// log-sum-exp (split_kv.hpp, the split-KV merge; sinks join there). Where it pays, measured as one
// call (GPU run 71, probe71, H100, replayed, 8k keys; against the general kernel unless named):
// 5-8 queries at batch >= 8 172-188 µs / 283 (b8), 545 / 1,086 (b32 x 8); 3-4 queries at batch 32 402
// against by tokens' 589, but at batch 8 161 / 154; batch 1 x 8 126 against by tokens' 49; 16 queries
// 364 / 281 (its time doubles from 8 to 16: the folded group of 64 heads per key head); 2k keys 82 / 83.
// GPU run 72 checked the whole rule against the reference (test_decode_prefix_tail.py, the stride fuzz).
//
// Described by rows (decode_prefix_tail_rows; off until a GPU run checks it): the same sequences and
// scratch, but each key head's group x tokens folded into the query rows (h_kv heads of
// h_q / h_kv x s_q rows) instead of the heads: cuDNN's general kernel then reads each key once per
// group, which its one-query kernel does not. GPU run 74 (probe74, H200, the prefix alone, unchunked):
// b8 x 8k 137 µs for 4, 8 or 16 tokens (the default plans 156 / 189 / 283), b32 274-282 (522 / 1,103),
// b8 x 2k x 8 43 (82); cut into chunks (prefix_tail_chunks) b8 77-78, b1 x 16 19 (145). So it takes
// 3-16 tokens at any batch, the prefix in chunks of its own beside the tails (split_kv.hpp).
constexpr int64_t kPrefixTailMaxQueries = 8, kPrefixTailMinKeys = 2048;
constexpr int64_t kPrefixTailMinQueries = 5, kPrefixTailMinQueriesWide = 3, kPrefixTailWideBatch = 32;
constexpr int64_t kPrefixTailRowsMinQueries = 3, kPrefixTailRowsMaxQueries = 16;
constexpr int64_t kPrefixTailMaxCopied = int64_t(128) << 20;
std::atomic<bool> prefix_tail_enabled{true};
std::atomic<bool> prefix_tail_rows_enabled{false};

// The pieces a prefix described by rows is cut into (a power of two, 1: whole): enough sequences x key
// heads of cuDNN's general kernel for one wave on a 132-SM GPU (probe74, H200, the prefix of b8 x 8k:
// 137 µs whole, 77 in 2 chunks; b32 274 whole, 285 in 2; b1 x 16 tokens 134 whole, 19 in 16), never
// chunks of fewer than 16 blocks of the declared table.
constexpr int64_t kPrefixTailTargetBlocks = 128, kPrefixTailMaxChunks = 16, kPrefixTailMinChunkBlocks = 16;

// Whether the split beats the alternatives (by tokens, cuDNN's general kernel) at this size.
bool prefix_tail_pays(const Problem& p, bool by_rows) {
  if (p.s_kv < kPrefixTailMinKeys) return false;
  if (by_rows) return p.s_q >= kPrefixTailRowsMinQueries && p.s_q <= kPrefixTailRowsMaxQueries;
  if (p.b == 1) return false;  // one entry: by tokens' one-query sequences fill the GPU better
  if (p.s_q > kPrefixTailMaxQueries) return false;
  return p.s_q >= (p.b >= kPrefixTailWideBatch ? kPrefixTailMinQueriesWide : kPrefixTailMinQueries);
}

bool plan_prefix_tail(GraphOp op, const Problem& p, const SdpaOptions& options, const TensorView* const* operands,
                      Plan& plan) {
  // (Validated: h_q a multiple of h_kv, both 0 only for an empty call.)
  const bool by_rows = prefix_tail_rows_enabled.load(std::memory_order_relaxed) && p.h_kv > 0;
  if (op != GraphOp::forward || !p.paged || !prefix_tail_pays(p, by_rows)) return false;
  if (!prefix_tail_enabled.load(std::memory_order_relaxed)) return false;
  if (has_operand_a_rewrite_cannot_carry(operands)) return false;
  if (options.left_bound() != SdpaOptions::kUnbounded || options.right_bound() != 0 ||
      options.alignment != CausalAlignment::bottom_right) {
    return false;
  }
  const TensorView table = *plan.slots[kBlockTable];  // its declared (possibly bucketed) width
  const int64_t width = table.dims[2];
  const int64_t prefix_chunks = by_rows ? prefix_tail_chunks(p.b, p.h_kv, width) : 1;
  const int64_t chunks = prefix_chunks + p.s_q, heads = p.h_q * p.s_q, sequences = p.b * chunks;
  const int64_t copied = sequences * heads * std::max(p.d_qk, p.d_v);  // elements of the copied q, of the partials
  if (sequences * width > INT32_MAX) return false;
  // The copies grow with (chunks + s_q) x s_q: past kPrefixTailMaxCopied elements each (256 MiB of bf16; b32
  // x 32 heads x 16 tokens x d 128 in 17 chunks is 36M) the scratch would rival the cache the call reads.
  if (copied > kPrefixTailMaxCopied) return false;
  SplitKv& split = start_split(p, operands, chunks, heads, plan);  // sinks: once per row, by the merge
  split.tokens = p.s_q;
  split.block_size = p.block_size;
  split.blocks_per_chunk = (width + prefix_chunks - 1) / prefix_chunks;  // every block in a chunk
  split.keys_per_chunk = split.blocks_per_chunk * p.block_size;
  split.rows = by_rows ? heads / p.h_kv : 1;  // (head x tokens + token) = (key head, group x tokens rows)
  plan.problem.h_q = heads / split.rows;
  plan.problem.s_q = split.rows;
  plan.problem.s_kv = split.keys_per_chunk;
  plan.problem.blocks = split.blocks_per_chunk;
  describe_split_scratch(p, operands, plan);
  // The table copy's rows (sequences, 1, blocks_per_chunk, 1), width apart: the prefix's chunks and
  // the tails shifted by the launch (a tail's at most s_q + block - 1 keys fit any chunk's blocks).
  TensorView& tail_table = set_view(plan, kBlockTable, table);
  tail_table.dims[0] = sequences;
  tail_table.dims[2] = split.blocks_per_chunk;
  return true;
}

}  // namespace

bool decode_prefix_tail() { return prefix_tail_enabled.load(std::memory_order_relaxed); }

void set_decode_prefix_tail(bool enabled) { prefix_tail_enabled.store(enabled); }

int64_t prefix_tail_chunks(int64_t batch, int64_t heads_kv, int64_t width) {
  int64_t chunks = 1;
  while (chunks < kPrefixTailMaxChunks && batch * heads_kv * chunks < kPrefixTailTargetBlocks &&
         width / (2 * chunks) >= kPrefixTailMinChunkBlocks) {
    chunks *= 2;
  }
  return chunks;
}

bool decode_prefix_tail_rows() { return prefix_tail_rows_enabled.load(std::memory_order_relaxed); }

void set_decode_prefix_tail_rows(bool enabled) { prefix_tail_rows_enabled.store(enabled); }

bool decode_by_tokens() { return by_tokens_enabled.load(std::memory_order_relaxed); }

void set_decode_by_tokens(bool enabled) { by_tokens_enabled.store(enabled); }

void plan_call(GraphOp op, const Problem& problem, const SdpaOptions& options, const TensorView* const* operands,
               int64_t cudnn_version, Plan& plan) {
  plan.problem = problem;
  plan.full_s_q = problem.s_q;
  plan.full_s_kv = problem.s_kv;
  const bool has_lengths = operands[kSeqLensQ] || operands[kSeqLensKV];
  const Visibility seen = visible_region(options, problem, has_lengths);
  std::copy(operands, operands + kNumSlots, plan.slots);
  if (!(options.dropout_p > 0)) plan.slots[kRngState] = nullptr;  // no dropout: the state is not read
  if (problem.nothing_to_do) return;
  if (plan_decode_by_heads(op, problem, options, operands, seen, cudnn_version, plan)) return;
  if (problem.ragged) {
    plan_ragged(op, options, operands, cudnn_version, plan);
    return;
  }
  if (problem.paged) {
    if (options.dropout_p > 0) {
      throw UnsupportedError(
          "dropout is not supported with a paged KV cache (block_table); paged calls serve "
          "inference.");
    }
    // cuDNN reads the launch's range-checked, packed copy of the table: described packed, at its
    // bucketed width (the padding lengths keep cuDNN inside each sequence's own blocks).
    TensorView& table = set_view(plan, kBlockTable, *operands[kBlockTable]);
    if (decode_graphs_bucketed()) table.dims[2] = power_of_two_bucket(table.dims[2], 8);
    table.strides[0] = table.dims[2];
    table.strides[2] = 1;
    if (plan_split_kv(op, problem, options, operands, plan)) return;
    if (plan_prefix_tail(op, problem, options, operands, plan)) return;
    if (plan_decode_by_tokens(op, problem, options, operands, cudnn_version, plan)) return;
  }
  // cuDNN writes dbias only where scores take part, and sums into it over shared axes: zero first.
  if (operands[kGradBias]) add_fill(plan, *operands[kGradBias], kGradBias);
  if (operands[kBias]) expand_bias_rows(plan);
  if (has_lengths) {
    // cuDNN writes no statistics for padded rows, and 0/0 for a sequence of length 0 (GPU run 53):
    // those rows get their documented values after it ran.
    fill_empty_rows_after(op, operands, operands, plan);
    if (!operands[kSeqLensQ]) make_lengths(plan, kSeqLensQ, problem.s_q);
    if (!operands[kSeqLensKV]) make_lengths(plan, kSeqLensKV, problem.s_kv);
    one_row_sees_every_key(op, options, true, plan);
    one_query_with_sinks(op, options, true, plan);
    return;
  }
  if (seen.restricts(problem)) {
    const bool rows_cut = seen.row_begin != 0 || seen.row_end != problem.s_q;
    if (operands[kSinks] && rows_cut) {
      throw UnsupportedError("attention sinks with rows that see no key (" +
                             std::to_string(problem.s_q - (seen.row_end - seen.row_begin)) + " of " +
                             std::to_string(problem.s_q) +
                             " rows under this mask) are not supported: such a row's statistics " +
                             "would be its head's sink value, which stridedfa cannot write without a kernel; use a "
                             "mask under which every " +
                             "row sees a key (e.g. s_q <= s_kv with bottom-right alignment).");
    }
    restrict_to(op, seen, operands, cudnn_version, plan);
  }
  if (op == GraphOp::backward && !plan.nothing_for_cudnn && plan.problem.s_q == 1 && plan.problem.s_kv == 1) {
    one_query_one_key_backward(plan);
    return;
  }
  // cuDNN runs a left bound, or a bottom-right right bound, with s_q > s_kv only in padding mode.
  const bool banded =
      options.left_bound() != SdpaOptions::kUnbounded ||
      (options.alignment == CausalAlignment::bottom_right && options.right_bound() != SdpaOptions::kUnbounded);
  if (!plan.nothing_for_cudnn && banded && plan.problem.s_q > plan.problem.s_kv) {
    make_lengths(plan, kSeqLensQ, plan.problem.s_q);
    make_lengths(plan, kSeqLensKV, plan.problem.s_kv);
  }
  one_row_sees_every_key(op, options, false, plan);
  one_query_with_sinks(op, options, false, plan);
}

}  // namespace stridedfa
