// Orchestration of one call: validate -> plan (call_plan.hpp) -> describe the graph -> cache lookup
// (build on miss) -> execute on the caller's stream, with the plan's fills, copy and staging.
#include "stridedfa/sdpa.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "stridedfa/bounds_check.hpp"
#include "stridedfa/call_plan.hpp"
#include "stridedfa/cudnn_graphs.hpp"
#include "stridedfa/cudnn_quirks.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/graph_cache.hpp"
#include "stridedfa/memops.hpp"
#include "stridedfa/runtime.hpp"
#include "stridedfa/split_kv.hpp"
#include "stridedfa/validate_ragged.hpp"

namespace stridedfa {
namespace {

// Lays out the launch's scratch in the workspace after cuDNN's own (call.scratch; the workspace
// the caller allocates is then call.workspace_bytes), and decides which made lengths the table
// kernel writes in the same launch: the paged view's (one query, the cache's keys, a row each),
// and a paged call's query lengths (every row of its table copy the same).
void lay_out_scratch(PreparedCall& call) {
  int64_t bytes = call.cudnn_workspace_bytes;
  const auto place = [&](int64_t size) {
    const int64_t at = (bytes + 255) / 256 * 256;
    bytes = at + std::max<int64_t>(size, 1);
    return at;
  };
  PreparedCall::Scratch& s = call.scratch;
  const int64_t copy_rows = call.block_table.dims[0] * table_copies(call.by_tokens, call.split.tail_rows());
  if (call.paged) {
    s.table_bytes = (std::max<int64_t>(copy_rows * call.table_width, 1) * int64_t(sizeof(int32_t)) + 15) / 16 * 16;
    s.table = place(s.table_bytes + (call.by_tokens.on ? copy_rows * int64_t(sizeof(int32_t)) : 0));
  } else if (call.heads_table.on) {
    s.table = place(call.heads_table.rows * call.heads_table.width * int64_t(sizeof(int32_t)));
  }
  if (call.split.on) s.split = place(split_kv_bytes(call.split));
  if (call.ragged.on) s.ragged = place(call.ragged.bytes());
  if (call.made_lengths_ptr[0] >= 0 || call.made_lengths_ptr[1] >= 0) {
    s.lengths_pitch = (call.made_lengths_rows + 3) / 4 * 4;
    s.lengths = place(2 * s.lengths_pitch * int64_t(sizeof(int32_t)));
  }
  if (call.staged_lse_ptr >= 0) s.staged = place(call.staged_lse_source.numel() * call.staged_lse_source.itemsize());
  if (call.sink_fold_lse_ptr >= 0) s.folded = place(call.sink_fold.scratch_bytes());
  call.workspace_bytes = bytes;
  const bool made_q = call.made_lengths_ptr[0] >= 0, made_kv = call.made_lengths_ptr[1] >= 0;
  if (call.heads_table.on && made_q && made_kv && call.made_lengths_value[0] == 1 &&
      call.made_lengths_value[1] == call.heads_table.length && call.made_lengths_rows == call.heads_table.rows) {
    call.made_lengths_by_table[0] = call.made_lengths_by_table[1] = true;
  }
  if (call.paged && !call.split.on && made_q && call.made_lengths_rows == copy_rows)
    call.made_lengths_by_table[0] = true;
}

// cuDNN never steps along an extent-1 axis, so its stride carries no information: each gets the
// stride a packed tensor would have there (the extent times the stride of the next axis that has
// extent > 1, or 1 when none follows). Calls that differ only on extent-1 axes then share one
// graph, and a tensor that is packed on its other axes is described exactly as packed -- which
// cuDNN demands of some operands by version (the backward's statistics below 9.26), also when
// h or s is 1.
OperandDesc describe_operand(const TensorView& t) {
  OperandDesc d;
  d.present = t.present;
  if (!t.present) return d;
  int64_t inner = 1;  // the packed stride of the axis being filled, from the innermost outwards
  for (int i = 3; i >= 0; --i) {
    d.dims[i] = t.dims[i];
    if (t.dims[i] != 1) {
      d.strides[i] = t.strides[i];
      inner = t.strides[i] * t.dims[i];
    } else {
      d.strides[i] = inner;
    }
  }
  return d;
}

std::string strides_of(const OperandDesc& d, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d.strides[i]);
  return s + ")";
}

// Row-major without gaps on the axes that have extent > 1 (describe_operand canonicalises the rest).
bool is_packed(const OperandDesc& d) {
  int64_t inner = 1;
  for (int i = 3; i >= 0; --i) {
    if (d.dims[i] != 1 && d.strides[i] != inner) return false;
    inner *= d.dims[i];
  }
  return true;
}

// Layouts cuDNN reads correctly only from some version on: refused here, with the layout that
// works, instead of by the frontend (or, before its checks existed, by wrong numbers).
void check_version_gates(const GraphSpec& spec) {
  const OperandDesc& lse = spec.operands[kLse];
  if (!lse.present || spec.ragged) return;  // ragged statistics are read through their offsets
  const bool backward = spec.op == GraphOp::backward;
  const int64_t since = backward ? 92600 : 91200;
  if (spec.cudnn_version >= since) return;
  const int64_t h = lse.dims[1], s = lse.dims[2];
  const bool packed = lse.strides[0] == h * s && lse.strides[1] == s && lse.strides[2] == 1;
  if (packed) return;
  throw UnsupportedError(
      std::string("lse: cuDNN ") + std::to_string(spec.cudnn_version / 10000) + "." +
      std::to_string(spec.cudnn_version / 100 % 100) + " " + (backward ? "reads" : "writes") +
      " the softmax statistics " + (backward ? "of the backward " : "") + "only as a packed float32 (batch, heads, " +
      "seq) tensor (cuDNN " + (backward ? "9.26" : "9.12") + " lifts this); lse has strides " + strides_of(lse, 3) +
      " for shape (" + std::to_string(lse.dims[0]) + ", " + std::to_string(h) + ", " + std::to_string(s) +
      "), the packed layout is (" + std::to_string(h * s) + ", " + std::to_string(s) +
      ", 1). Pass a contiguous lse (e.g. lse.contiguous()), or let stridedfa allocate it.");
}

// Whether the caller gave padding lengths, on either side (the core makes the other one).
bool caller_gave_lengths(const Plan& plan) {
  return (plan.slots[kSeqLensQ] && plan.made_lengths[0] < 0) || (plan.slots[kSeqLensKV] && plan.made_lengths[1] < 0);
}

// cuDNN takes a bias or dropout only with a top-left band. A bottom-right band is the top-left band
// shifted by s_kv - s_q (the diagonal of the last query on the last key), which is what it is
// given then. With padding lengths the bottom-right diagonal moves per sequence, which no static
// band says.
// `keeps_keys`: the plan kept every key (call_plan.cpp), so no cut brings the band's left edge back
// to the diagonal.
void as_top_left(GraphSpec& spec, const Problem& p, bool lengths_given, bool keeps_keys) {
  const bool band = spec.left_bound != SdpaOptions::kUnbounded || spec.right_bound != SdpaOptions::kUnbounded;
  if (spec.alignment != CausalAlignment::bottom_right || !band) return;
  const bool bias = spec.operands[kBias].present;
  const std::string what = bias ? "a bias" : "dropout";
  if (lengths_given) {
    throw UnsupportedError(
        what +
        " with a bottom-right causal mask or window and padding lengths (seqlens_q / seqlens_kv) is not "
        "supported: cuDNN's bottom-right mask takes no " +
        (bias ? "bias" : "dropout") + ", and with padding the diagonal moves per sequence. Use top-left alignment" +
        (bias ? ", or fold the mask into the bias." : "."));
  }
  const int64_t shift = p.s_kv - p.s_q;
  const int64_t left = spec.left_bound == SdpaOptions::kUnbounded ? 0 : spec.left_bound - shift;
  const int64_t right = spec.right_bound == SdpaOptions::kUnbounded ? 0 : spec.right_bound + shift;
  if (left < 0 || right < 0) {
    throw UnsupportedError(
        what + " with this bottom-right band is not supported: cuDNN takes " + what +
        " only with top-left bands, and this one would need a negative " + std::string(left < 0 ? "left" : "right") +
        " bound (s_q = " + std::to_string(p.s_q) + ", s_kv = " + std::to_string(p.s_kv) + ")" +
        (keeps_keys ? " because the bias' gradient keeps every key; leave grad_bias out, use" : "; use") +
        " top-left alignment" + (bias ? ", or fold the mask into the bias." : "."));
  }
  spec.alignment = CausalAlignment::top_left;
  if (spec.left_bound != SdpaOptions::kUnbounded) spec.left_bound = left;
  if (spec.right_bound != SdpaOptions::kUnbounded) spec.right_bound = right;
}

// Whether every sequence has as many queries as keys, so that the bottom-right diagonal is the
// top-left one: one full-length batch, padding lengths given by one tensor for both sides, or
// variable-length sequences cut by one cu_seqlens tensor for both.
bool diagonals_coincide(const Plan& plan) {
  if (plan.ragged.on && plan.ragged.by_heads)
    return plan.ragged.len_q == plan.ragged.len_kv && !plan.ragged.callers_kv.data;
  if (plan.ragged.on) return plan.ragged.cu_q == plan.ragged.cu_kv;
  if (plan.full_s_q != plan.full_s_kv || plan.problem.s_q != plan.problem.s_kv) return false;
  const TensorView* q = plan.slots[kSeqLensQ];
  const TensorView* kv = plan.slots[kSeqLensKV];
  if (!q && !kv) return true;
  const bool both_made = plan.made_lengths[0] >= 0 && plan.made_lengths[1] >= 0;
  const bool both_given = q && kv && plan.made_lengths[0] < 0 && plan.made_lengths[1] < 0;
  return both_made || (both_given && q->data == kv->data && q->strides[0] == kv->strides[0]);
}

// ALiBi's distance i + off - j (off: the alignment's diagonal offset, FlashAttention's
// i + s_kv - s_q - j bottom-right) in the row and key indices of the sub-problem cuDNN is given:
// shifted by the rows and keys the plan cut off; with the caller's padding lengths, bottom-right,
// the offset is per sequence (read on the device). cuDNN's own ALiBi has fixed slopes and needs a
// causal top-left mask, so stridedfa builds the term itself as a score modifier.
void set_alibi(GraphSpec& spec, const Plan& plan, const SdpaOptions& o) {
  const bool bottom_right = o.alignment == CausalAlignment::bottom_right;
  const bool lengths_given = caller_gave_lengths(plan);
  if (bottom_right && lengths_given) {  // GPU run 30: the per-sequence offset gave wrong numbers
    throw UnsupportedError(
        "ALiBi with bottom-right alignment and padding lengths (a distance offset per sequence) is not "
        "supported yet; use top-left alignment with padding, or bottom-right without padding lengths.");
  }
  const int64_t full_offset = bottom_right && !lengths_given ? plan.full_s_kv - plan.full_s_q : 0;
  spec.alibi_offset = plan.row_begin - plan.key_begin + full_offset;
}

// Quirks bias_grad_under_score_modifier and bias_grad_packed_only (cudnn_quirks.hpp).
void check_bias_gradient(const GraphSpec& spec) {
  const OperandDesc& g = spec.operands[kGradBias];
  if (!g.present) return;
  if ((spec.softcap > 0 || spec.operands[kAlibiSlopes].present) &&
      quirk_applies(Quirk::bias_grad_under_score_modifier, spec.cudnn_version)) {
    throw UnsupportedError(std::string("the bias' gradient with ") + (spec.softcap > 0 ? "a softcap" : "ALiBi") +
                           " is not supported (cuDNN 9.19 computes it wrongly under a score modifier); leave "
                           "grad_bias out (a bias that does not require grad)." +
                           quirk_tag(Quirk::bias_grad_under_score_modifier));
  }
  if (!is_packed(g) && quirk_applies(Quirk::bias_grad_packed_only, spec.cudnn_version)) {
    throw UnsupportedError(
        "grad_bias: cuDNN writes the bias' gradient only as a packed (row-major) tensor; its "
        "strides as cuDNN would see them are " +
        strides_of(g, 4) +
        " (the mask cuts rows or keys, or the buffer is strided). Pass a contiguous "
        "grad_bias, or a mask under which every row and key takes part." +
        quirk_tag(Quirk::bias_grad_packed_only));
  }
}

// Quirks sinks_grad_under_dropout and unpacked_bias_one_by_one (cudnn_quirks.hpp): at s_q = s_kv = 1
// (e.g. the one row and key a mask left, of a (1, h, 33, 1) bias) a bias that is not packed is
// misread into lse (out is right), which the backward's P = exp(S - lse) would carry into the
// gradients.
void check_known_wrong(const GraphSpec& spec) {
  if (spec.operands[kGradSinks].present && spec.dropout_p > 0 &&
      quirk_applies(Quirk::sinks_grad_under_dropout, spec.cudnn_version)) {
    throw UnsupportedError(
        "the sinks' gradient with dropout is not supported: cuDNN 9.19 returns it scaled by 1 - dropout_p. "
        "Use dropout_p=0 with trainable sinks, or sinks that do not require grad." +
        quirk_tag(Quirk::sinks_grad_under_dropout));
  }
  const OperandDesc& bias = spec.operands[kBias];
  const bool one_by_one = spec.operands[kQ].dims[2] == 1 && spec.operands[kK].dims[2] == 1;
  if (spec.op != GraphOp::forward || !one_by_one || !bias.present || !spec.operands[kLse].present) return;
  if (!is_packed(bias) && quirk_applies(Quirk::unpacked_bias_one_by_one, spec.cudnn_version)) {
    throw UnsupportedError(
        "bias: with s_q = s_kv = 1 (after the mask leaves one row and one key) cuDNN 9.19 reads only a packed "
        "bias into lse; this one has strides " +
        strides_of(bias, 4) +
        " as cuDNN would see them. Pass a contiguous bias (e.g. its slice for that row, .contiguous()), "
        "or call without lse (inference), whose output is right." +
        quirk_tag(Quirk::unpacked_bias_one_by_one));
  }
}

// Quirk varlen_backward_sm8x_sm12x (ragged statistics, which stridedfa's THD lse always are):
// refused by name instead of by the frontend's wording.
void check_ragged_backward(const GraphSpec& spec) {
  const int32_t major = spec.sm_version / 10;
  if (!spec.ragged || spec.op != GraphOp::backward || (major != 8 && major != 12)) return;
  if (!quirk_applies(Quirk::varlen_backward_sm8x_sm12x, spec.cudnn_version)) return;
  throw UnsupportedError("the variable-length (cu_seqlens) backward is not supported on compute capability " +
                         std::to_string(major) +
                         ".x: cuDNN runs it with ragged statistics on Hopper and "
                         "datacenter Blackwell only. Train with padded tensors and seqlens_q / seqlens_kv there." +
                         quirk_tag(Quirk::varlen_backward_sm8x_sm12x));
}

GraphSpec spec_for(GraphOp op, const Plan& plan, const SdpaOptions& o, int32_t sm_version, int64_t cudnn_version) {
  const Problem& p = plan.problem;
  GraphSpec spec;
  spec.op = op;
  spec.dtype = p.dtype;
  for (int s = 0; s < kNumSlots; ++s) {
    if (plan.slots[s]) spec.operands[s] = describe_operand(*plan.slots[s]);
  }
  // cuDNN reads rng_state as two scalars (its pointer and the next value's): its own stride is no
  // part of the graph, so calls that differ only there share one.
  if (spec.operands[kRngState].present) {
    for (int64_t& stride : spec.operands[kRngState].strides) stride = 2;
    spec.operands[kRngState].strides[3] = 1;
  }
  spec.scale = static_cast<float>(o.has_scale ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.d_qk)));
  spec.causal = o.causal && !plan.unmasked;
  // Where the diagonals coincide, say top-left: cuDNN's backward skips the blocks above a top-left
  // diagonal but not above a bottom-right one (GPU run 46, 8 x 4096, 16 heads of 128: 4.0 vs 6.3 ms
  // per causal forward + backward), and the two masks are the same. Where no mask is left, too: one
  // graph whatever alignment the caller named.
  spec.alignment = plan.unmasked || diagonals_coincide(plan) ? CausalAlignment::top_left : o.alignment;
  spec.left_bound = plan.unmasked ? SdpaOptions::kUnbounded : o.left_bound();
  spec.right_bound = plan.unmasked ? SdpaOptions::kUnbounded : o.right_bound();
  spec.dropout_p = plan.slots[kRngState] ? static_cast<float>(o.dropout_p) : 0.0f;
  if (spec.operands[kBias].present || spec.dropout_p > 0) {
    as_top_left(spec, p, caller_gave_lengths(plan), plan.keeps_keys);
  }
  spec.deterministic = op == GraphOp::backward && o.deterministic;
  spec.softcap = static_cast<float>(o.softcap);
  if (spec.operands[kAlibiSlopes].present) set_alibi(spec, plan, o);
  if (plan.ragged.on) {  // the workspace is sized by the tokens (a bucket of them: one graph for many)
    spec.ragged = true;
    spec.max_total_q = plan.ragged.declared_total_q();
    spec.max_total_kv = plan.ragged.declared_total_kv();
  }
  spec.device = p.device;
  spec.sm_version = sm_version;
  spec.cudnn_version = cudnn_version;
  check_version_gates(spec);
  check_bias_gradient(spec);
  check_known_wrong(spec);
  check_ragged_backward(spec);
  return spec;
}

PreparedCall prepare(GraphOp op, const Problem& problem, const SdpaOptions& options,
                     const TensorView* const* operands) {
  PreparedCall call;
  call.problem = problem;
  if (problem.nothing_to_do) {  // only a sinks' or a shared bias' gradient can have elements: zero
    for (int s : {kGradSinks, kGradBias}) {
      if (operands[s] && operands[s]->numel() != 0) call.fills[call.n_fills++] = {*operands[s], 0u};
    }
    return call;
  }
  if (!libraries_loaded()) {
    throw BackendError("cuDNN is not loaded; stridedfa loads it on the first GPU call (see stridedfa.info())");
  }
  const int64_t cudnn_version = cudnn_runtime_version();
  Plan plan;
  plan_call(op, problem, options, operands, cudnn_version, plan);
  call.n_fills = plan.n_fills;
  std::copy(plan.fills, plan.fills + plan.n_fills, call.fills);
  call.n_copies = plan.n_copies;
  std::copy(plan.copies, plan.copies + plan.n_copies, call.copies);
  if (plan.nothing_for_cudnn) return call;
  const GraphSpec spec = spec_for(op, plan, options, device_info(problem.device).sm_version, cudnn_version);
  // A training or decoding loop repeats its last configuration: each thread remembers its last
  // lookup, and a repeat redeems a ticket instead of hashing and comparing a key in the cache.
  thread_local struct {
    int64_t key[GraphSpec::kMaxKeyLength];
    int length = 0;
    GraphCache::Ticket ticket;
  } last;
  int64_t key[GraphSpec::kMaxKeyLength];
  const int length = spec.write_key(key);
  if (length == last.length && std::memcmp(key, last.key, sizeof(int64_t) * size_t(length)) == 0) {
    call.graph = graph_cache().redeem(last.ticket);
  }
  if (!call.graph) {
    last.length = 0;  // until the lookup below succeeds
    const std::vector<int64_t> full_key(key, key + length);
    call.graph = graph_cache().get_or_build(
        full_key,
        [&] {
          DeviceGuard guard(spec.device);
          return load_or_build_graph(spec, full_key, cudnn_handle_for(spec.device, 0));
        },
        &last.ticket);
    std::memcpy(last.key, key, sizeof(int64_t) * size_t(length));
    last.length = length;
  }
  call.cudnn_workspace_bytes = call.graph->workspace_bytes;
  call.n_ptrs = static_cast<int>(call.graph->operand_order.size());
  call.ragged = plan.ragged;
  if (problem.paged) {
    call.paged = true;
    call.block_table = *operands[kBlockTable];
    call.table_width = plan.slots[kBlockTable]->dims[2];
    call.num_blocks = problem.num_blocks;
  }
  call.heads_table = plan.heads_table;
  call.by_tokens = plan.by_tokens;
  call.made_lengths_rows = plan.problem.b;
  call.split = plan.split;
  call.sink_fold = plan.sink_fold;
  // A split's chunks read the entries' rows of the copy in pieces; a prefix + tail split's rows are
  // whole, the view's row stride apart (its chunks may read fewer columns of each: by rows).
  if (plan.split.on) {
    call.table_width = plan.split.prefix_tail() ? plan.slots[kBlockTable]->strides[0]
                                                : plan.split.chunks * plan.split.blocks_per_chunk;
  }
  std::fill(std::begin(call.ragged_row_of_ptr), std::end(call.ragged_row_of_ptr), int8_t(-1));
  call.n_empty_rows = plan.n_empty_rows;
  std::copy(plan.empty_rows, plan.empty_rows + plan.n_empty_rows, call.empty_rows);
  if (plan.slots[kSinks]) {
    call.sinks = plan.slots[kSinks]->data;
    call.sinks_stride = plan.slots[kSinks]->strides[1];
  }
  for (int side = 0; side < 2; ++side) {
    const TensorView* given = operands[kSeqLensQ + side];
    if (given && given->present) call.callers_lengths[side] = {given->data, given->dims[0] > 1 ? given->strides[0] : 1};
  }
  for (int i = 0; i < call.n_ptrs; ++i) {
    const int slot = call.graph->operand_order[size_t(i)];
    if (plan.split.on && (slot == kQ || slot == kO || slot == kLse || slot == kSeqLensQ || slot == kSeqLensKV)) {
      const SplitPart part = slot == kQ          ? SplitPart::queries
                             : slot == kO        ? SplitPart::outputs
                             : slot == kLse      ? SplitPart::statistics
                             : slot == kSeqLensQ ? SplitPart::lengths_q
                                                 : SplitPart::lengths_kv;
      call.split_ptr[int(part)] = i;
      continue;
    }
    if (slot == kSeqLensQ || slot == kSeqLensKV) call.lengths_ptr[slot - kSeqLensQ] = i;
    if (plan.ragged.on && (slot == kSeqLensQ || slot == kSeqLensKV || slot >= kRaggedOffsetTensor)) {
      // rows of the kernel's buffer: the lengths, then the offsets rows
      call.ragged_row_of_ptr[i] =
          int8_t(slot < kRaggedOffsetTensor ? slot - kSeqLensQ : 2 + plan.ragged.row_of[slot - kRaggedOffsetTensor]);
      continue;
    }
    if (slot == kBlockTable || slot == kPageTableV) {  // the launch's range-checked copy
      call.page_table_ptr[slot == kBlockTable ? 0 : 1] = i;
      continue;
    }
    if (slot == kRngOffsetTensor) {  // rng_state's second value
      const TensorView& rng = *plan.slots[kRngState];
      call.ptrs[i] = reinterpret_cast<void*>(rng.data + std::uintptr_t(rng.strides[3] * 8));
      continue;
    }
    call.ptrs[i] = reinterpret_cast<void*>(plan.slots[slot]->data);
    if (slot == kLse && plan.sink_fold.on && !plan.sink_fold.lse.present) call.sink_fold_lse_ptr = i;
    if (slot == kLse && plan.stage_lse) {
      call.staged_lse_ptr = i;
      call.staged_lse_source = plan.lse_source;
      call.staged_lse_output = op == GraphOp::forward;
    }
    if ((slot == kSeqLensQ || slot == kSeqLensKV) && plan.made_lengths[slot - kSeqLensQ] >= 0) {
      call.made_lengths_ptr[slot - kSeqLensQ] = i;
      call.made_lengths_value[slot - kSeqLensQ] = plan.made_lengths[slot - kSeqLensQ];
    }
  }
  lay_out_scratch(call);
  return call;
}

}  // namespace

int GraphSpec::write_key(int64_t* out) const {
  int n = 0;
  out[n++] = static_cast<int64_t>(op);
  out[n++] = int64_t(dtype.code) | int64_t(dtype.bits) << 8 | int64_t(dtype.lanes) << 16;
  for (const OperandDesc& d : operands) {
    out[n++] = d.present;
    if (!d.present) continue;
    for (int i = 0; i < 4; ++i) out[n++] = d.dims[i];
    for (int i = 0; i < 4; ++i) out[n++] = d.strides[i];
  }
  int32_t scale_bits;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  out[n++] = scale_bits;
  out[n++] = causal;
  out[n++] = static_cast<int64_t>(alignment);
  out[n++] = left_bound;
  out[n++] = right_bound;
  out[n++] = deterministic;
  int32_t softcap_bits;
  std::memcpy(&softcap_bits, &softcap, sizeof softcap_bits);
  out[n++] = softcap_bits;
  out[n++] = alibi_offset;
  int32_t dropout_bits;
  std::memcpy(&dropout_bits, &dropout_p, sizeof dropout_bits);
  out[n++] = dropout_bits;
  out[n++] = ragged;
  out[n++] = max_total_q;
  out[n++] = max_total_kv;
  out[n++] = device;
  out[n++] = sm_version;
  out[n++] = cudnn_version;
  return n;
}

std::vector<int64_t> GraphSpec::key() const {
  int64_t k[kMaxKeyLength];
  return std::vector<int64_t>(k, k + write_key(k));
}

namespace {

std::vector<int64_t> graph_key(GraphOp op, const Problem& problem, const SdpaOptions& options,
                               const OperandViews& operands, int32_t sm_version, int64_t cudnn_version) {
  Plan plan;
  plan_call(op, problem, options, operands.slots, cudnn_version, plan);
  if (problem.nothing_to_do || plan.nothing_for_cudnn) return {};
  return spec_for(op, plan, options, sm_version, cudnn_version).key();
}

}  // namespace

PreparedCall prepare_call(const CallOperands& call, const SdpaOptions& options) {
  const Problem problem = validate_call(call);
  validate_options(options, problem);
  return prepare(call.op, problem, options, OperandViews(call).slots);
}

std::vector<int64_t> call_graph_key(const CallOperands& call, const SdpaOptions& options, int32_t sm_version,
                                    int64_t cudnn_version) {
  const Problem problem = validate_call(call);
  validate_options(options, problem);
  return graph_key(call.op, problem, options, OperandViews(call), sm_version, cudnn_version);
}

namespace {
std::atomic<int64_t> own_workspace_count{0};
}  // namespace

int64_t own_workspace_allocations() { return own_workspace_count.load(std::memory_order_relaxed); }

void execute(const PreparedCall& call, std::uintptr_t stream, void* workspace) {
  if (call.problem.nothing_to_do && call.n_fills == 0) return;
  DeviceGuard guard(call.problem.device);
  // The fills, copies and staging below are driver calls: once per call, the context made current.
  const bool memops = call.n_fills > 0 || call.n_copies > 0 || call.staged_lse_ptr >= 0 ||
                      call.made_lengths_ptr[0] >= 0 || call.made_lengths_ptr[1] >= 0 || call.ragged.on || call.paged ||
                      call.heads_table.on || call.n_empty_rows > 0;
  if (memops) bind_device_context(call.problem.device);
  if (memops && bounds_check_enabled()) check_bounds(call, stream);  // before anything is written
  for (int i = 0; i < call.n_fills; ++i) fill_strided(call.fills[i].region, call.fills[i].pattern, stream);
  for (int i = 0; i < call.n_copies; ++i) copy_strided(call.copies[i].from, call.copies[i].to, stream);
  if (!call.graph) return;
  void* handle = cudnn_handle_for(call.problem.device, stream);
  const PreparedCall::Scratch& scratch = call.scratch;
  void* pooled = nullptr;
  if (call.workspace_bytes > 0 && workspace == nullptr) {
    workspace = pooled = pool_alloc(call.problem.device, call.workspace_bytes, stream);
    own_workspace_count.fetch_add(1, std::memory_order_relaxed);
  }
  const auto at = [&](int64_t offset) -> void* {
    return offset < 0 ? nullptr : static_cast<char*>(workspace) + offset;
  };
  void* const table = at(scratch.table);
  void* const split = at(scratch.split);
  void* const ragged = at(scratch.ragged);
  void* const lengths = at(scratch.lengths);
  void* const staged = at(scratch.staged);
  void* const folded = at(scratch.folded);
  void* ptrs[kMaxGraphTensors];
  std::copy(call.ptrs, call.ptrs + call.n_ptrs, ptrs);
  try {
    if (call.paged) {  // block ids clamped into the cache: no id reads outside it
      const ByTokens& tokens = call.by_tokens;
      void* made_lengths = tokens.on ? static_cast<char*>(table) + scratch.table_bytes : nullptr;
      clamp_block_table(call.block_table, call.num_blocks, call.table_width, tokens, call.split.tail_rows(),
                        call.callers_lengths[1], made_lengths, call.problem.device, table, stream,
                        call.made_lengths_by_table[0] ? lengths : nullptr, call.made_lengths_value[0]);
      if (tokens.on) {  // the tokens' key lengths: the graph always reads seq_len_kv with seq_len_q
        if (call.lengths_ptr[1] < 0) throw BackendError("stridedfa: a call by tokens has no key lengths operand");
        ptrs[call.lengths_ptr[1]] = made_lengths;
      }
    } else if (call.heads_table.on) {  // decoding by heads through a paged view: each head's rows,
      // and in the same launch the made lengths (one query, the cache's keys) when they are those
      make_heads_table(call.heads_table, call.problem.device, table, call.made_lengths_by_table[1] ? lengths : nullptr,
                       scratch.lengths_pitch, stream);
    }
    for (int side = 0; side < 2 && table; ++side) {  // K's and V's page tables: the one made table
      if (call.page_table_ptr[side] >= 0) ptrs[call.page_table_ptr[side]] = table;
    }
    if (call.split.on) {  // the chunks' queries and lengths; cuDNN writes their partials beside them
      split_kv_inputs(call.split, split, call.callers_lengths[1], call.problem.device, stream);
      for (int part = 0; part < 5; ++part) {
        if (call.split_ptr[part] >= 0) ptrs[call.split_ptr[part]] = split_kv_part(call.split, split, SplitPart(part));
      }
    }
    if (call.ragged.on) {
      make_ragged_offsets(call.ragged, call.problem.device, ragged, stream);
      const int64_t row_bytes = call.ragged.pitch() * int64_t(sizeof(int32_t));
      for (int i = 0; i < call.n_ptrs; ++i) {
        if (call.ragged_row_of_ptr[i] >= 0)
          ptrs[i] = static_cast<char*>(ragged) + call.ragged_row_of_ptr[i] * row_bytes;
      }
    }
    if (lengths) {
      const int64_t b = call.made_lengths_rows;
      const int64_t pitch = scratch.lengths_pitch;
      for (int side = 0; side < 2; ++side) {
        if (call.made_lengths_ptr[side] < 0) continue;
        TensorView region;
        region.present = true;
        region.ndim = 1;
        region.dims[0] = b;
        region.strides[0] = 1;
        region.dtype = {kDLInt, 32, 1};
        region.device_type = kDLCUDA;
        region.device_id = call.problem.device;
        region.data = reinterpret_cast<std::uintptr_t>(lengths) + std::uintptr_t(side * pitch * 4);
        if (!call.made_lengths_by_table[side])
          fill_strided(region, static_cast<uint32_t>(call.made_lengths_value[side]), stream);
        ptrs[call.made_lengths_ptr[side]] = reinterpret_cast<void*>(region.data);
      }
    }
    const bool forward = call.staged_lse_output;
    if (call.staged_lse_ptr >= 0) {
      const TensorView& user = call.staged_lse_source;
      if (!forward) copy_to_packed(user, staged, stream);
      ptrs[call.staged_lse_ptr] = staged;
    }
    // The statistics the sink fold reads, where the caller asked for no lse.
    if (call.sink_fold_lse_ptr >= 0) ptrs[call.sink_fold_lse_ptr] = folded;
    call.graph->execute(handle, ptrs, workspace);
    if (split) split_kv_merge(call.split, split, call.problem.device, stream);
    if (call.sink_fold.on) {
      fold_sinks(call.sink_fold, folded ? reinterpret_cast<std::uintptr_t>(folded) : call.sink_fold.lse.data,
                 call.problem.device, stream);
    }
    if (call.staged_lse_ptr >= 0 && forward) {
      const TensorView& user = call.staged_lse_source;
      copy_strided(packed_like(user, reinterpret_cast<std::uintptr_t>(staged)), user, stream);
    }
    RowLengths lengths[2];
    for (int side = 0; side < 2; ++side) {
      lengths[side] = call.callers_lengths[side];
      // A ragged call's lengths are per sequence (by heads: b x h_kv of them), in the launch's rows;
      // a call by tokens has one per token, made beside its table.
      if ((call.ragged.on || call.by_tokens.on || !lengths[side].data) && call.lengths_ptr[side] >= 0)
        lengths[side] = {reinterpret_cast<std::uintptr_t>(ptrs[call.lengths_ptr[side]]), 1};
    }
    const bool lengths_known = lengths[0].data && lengths[1].data;
    for (int i = 0; lengths_known && i < call.n_empty_rows; ++i) {
      const EmptyRows& e = call.empty_rows[i];
      const std::uintptr_t offsets =
          e.ragged_row < 0 ? 0
                           : reinterpret_cast<std::uintptr_t>(ragged) +
                                 std::uintptr_t((2 + e.ragged_row) * call.ragged.pitch() * int64_t(sizeof(int32_t)));
      const bool stats = e.rows.dtype.code == kDLFloat && e.rows.dtype.bits == 32;
      fill_empty_rows(e.rows, lengths[e.key_side], lengths[!e.key_side], offsets, e.sink_rows ? call.sinks : 0,
                      call.sinks_stride, stats ? kNegativeInfinityBits : 0u, call.problem.device, stream);
    }
  } catch (...) {
    if (pooled) pool_free(pooled, stream);
    throw;
  }
  if (pooled) pool_free(pooled, stream);
}

}  // namespace stridedfa
