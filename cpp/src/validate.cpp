// The validator: every rule a call must satisfy before anything is built or launched (the rules of
// one operand on its own in operand_rules.hpp, those between operands here). Each failure names the
// tensor, the axis, the offending value and the fix. Rules and why they exist:
//   - CUDA device, one ordinal; fp16/bf16 operands of one dtype, fp32 softmax statistics.
//   - Logical shapes agree: batch, h_q a multiple of h_kv, d_qk, d_v, s_q, s_kv.
//   - Addressable layouts (check_addressable): whatever a producer exports, a layout reaching
//     outside any address space is refused before a single stride is trusted.
//   - head_dim stride 1, no negative or zero (broadcast) strides on axes with extent > 1.
//   - 16-byte alignment of every pointer and of every stride (in bytes) of an axis with extent > 1:
//     cuDNN moves data with 16-byte vector loads and TMA and does not check; on Hopper a misaligned
//     operand gives wrong numbers silently (cudnn-frontend <= 1.23 never rejected it).
//   - Outputs are writable and share no byte with themselves, each other or any input (exact).
//   - Every output empty: nothing to do. Extent-1 axes may carry any stride.
//   - Options: a finite scale, window bounds of 0 or more (validate_options).
//   - Padding lengths: int32 (batch,) vectors on the call's device; sinks float32 (h_q,).
//   - bias: the attention dtype, broadcastable to (b, h_q, s_q, s_kv) (extent 1 or stride 0 shares an
//     axis) but a column per key, key axis contiguous, pointer 16-byte aligned (a misaligned one
//     faults: "misaligned address", GPU run 30); grad_bias has bias' shape (cuDNN sums over the
//     shared batch and head axes; over shared rows it computes garbage and writes past the tensor,
//     so that is refused), its own memory, and is packed.
//   - The backward's operands within 2^32 elements, out and grad_out within 4 GiB, of their data
//     pointers (cuDNN's 32-bit offsets; wrong gradients beyond).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "stridedfa/errors.hpp"
#include "stridedfa/cudnn_quirks.hpp"
#include "stridedfa/overlap.hpp"
#include "stridedfa/validate.hpp"
#include "stridedfa/validate_ragged.hpp"
#include "operand_rules.hpp"

namespace stridedfa {
namespace {

using namespace operand_rules;  // NOLINT: the Validator and the message helpers

// Shared by forward and backward: the attention operands' shapes.
Problem problem_from(const TensorView& q, const TensorView& k, const TensorView& v, bool paged) {
  Problem p;
  p.b = q.dims[0];
  p.h_q = q.dims[1];
  p.s_q = q.dims[2];
  p.d_qk = q.dims[3];
  p.h_kv = k.dims[1];
  p.s_kv = k.dims[2];
  p.d_v = v.dims[3];
  p.device = q.device_id;
  p.dtype = q.dtype;
  if (paged && v.dims[0] != k.dims[0]) {  // caches: their batch axis is the blocks
    throw LayoutError("v: axis 0 (blocks) is " + std::to_string(v.dims[0]) + " but k's is " +
                      std::to_string(k.dims[0]) + "; the k and v caches hold the same blocks.");
  }
  if (!paged && (k.dims[0] != p.b || v.dims[0] != p.b)) {
    const TensorView& bad = k.dims[0] != p.b ? k : v;
    throw LayoutError(std::string(bad.name) + ": batch (axis 0) is " + std::to_string(bad.dims[0]) + " but q's is " +
                      std::to_string(p.b) + "; q, k and v must share the batch size.");
  }
  if (k.dims[3] != p.d_qk) {
    throw LayoutError("k: head_dim (axis 3) is " + std::to_string(k.dims[3]) + " but q's is " + std::to_string(p.d_qk) +
                      "; q and k must share head_dim (v may differ).");
  }
  if (v.dims[1] != p.h_kv || v.dims[2] != p.s_kv) {
    int axis = v.dims[1] != p.h_kv ? 1 : 2;
    throw LayoutError("v: " + axis_str(v, axis) + " is " + std::to_string(v.dims[axis]) + " but k's is " +
                      std::to_string(k.dims[axis]) + "; k and v must share heads and seq.");
  }
  if (p.h_kv == 0 ? p.h_q != 0 : p.h_q % p.h_kv != 0) {
    throw LayoutError("q has " + std::to_string(p.h_q) + " heads and k has " + std::to_string(p.h_kv) +
                      "; the heads of q must be a multiple of the heads of k and v (GQA; MQA is 1 kv head).");
  }
  return p;
}

void require_nonempty_problem(const Problem& p) {
  const int64_t extents[] = {p.b, p.h_q, p.h_kv, p.s_q, p.s_kv, p.d_qk, p.d_v};
  const char* names[] = {"batch", "h_q", "h_kv", "s_q", "s_kv", "d_qk", "d_v"};
  for (int i = 0; i < 7; ++i) {
    // A variable-length call without queries or keys is defined: out 0, lse -inf, zero gradients.
    if (p.ragged && (i == 3 || i == 4)) continue;
    if (extents[i] == 0) {
      throw UnsupportedError(std::string(names[i]) + " is 0 while an output has elements; attention over an empty " +
                             "axis is not defined by cuDNN. Skip the call or give inputs with that axis non-empty.");
    }
  }
}

// Quirk backward_32bit_reach: cuDNN's backward addresses its operands with 32-bit arithmetic:
// out or grad_out reaching past 4 GiB (2^32 bytes) gives wrong or NaN dq/dk (its dO.O kernel,
// cudnn::fusion::compute_dot_do_o); q and dq with a batch stride of 2^32 + 64 elements leave half of
// dq unwritten, while 2^31 + 64 is read and written correctly. The forward reads and writes every
// operand correctly at strides up to 2^33 elements.
constexpr int64_t kBackwardReach = int64_t(1) << 32;

void require_32bit_reach(const TensorView& t, bool bytes) {
  const int64_t extent = element_extent(t) * (bytes ? t.itemsize() : 1);
  if (extent <= kBackwardReach) return;
  throw UnsupportedError(std::string(t.name) + ": its elements reach " + std::to_string(extent) +
                         (bytes ? " bytes" : " elements") + " past its data pointer; cuDNN's backward addresses " +
                         (bytes ? "out and grad_out within 4 GiB (2^32 bytes)" : "its operands within 2^32 elements") +
                         " and computes wrong gradients beyond. Pass a compact copy (x.contiguous()), or split " +
                         "the batch over several calls if the tensor itself is that large." +
                         quirk_tag(Quirk::backward_32bit_reach));
}

}  // namespace

bool cudnn_can_read(const TensorView& t) {
  if ((t.ndim != 4 && t.ndim != 3) || !is_half(t.dtype)) return false;
  try {
    Validator().memory(t, false, false);
  } catch (const LayoutError&) {
    return false;
  }
  return true;
}

namespace {

// A paged call's extents: k and v are (num_blocks, h_kv, block_size, d) caches, each sequence reads
// `blocks` of their blocks (s_kv = blocks * block_size) up to its cached length seqlens_kv.
void set_paged(Problem& p, const TensorView* const* t) {
  if (!t[kSeqLensKV]) {
    throw LayoutError("a paged call (block_table) needs seqlens_kv, each sequence's cached length (cache_seqlens).");
  }
  for (int s : {kCuSeqlensQ, kCuSeqlensKV, kBias, kAlibiSlopes}) {
    if (t[s]) {
      throw UnsupportedError(std::string(kOperands[s].name) +
                             " is not supported with a paged KV cache (block_table) yet; gather the cache into "
                             "contiguous k and v for this call.");
    }
  }
  if (t[kK]->dims[0] == 0 && t[kBlockTable]->numel() != 0) {
    throw LayoutError("k: the paged cache has no blocks, but block_table names some; give the cache its blocks.");
  }
  p.paged = true;
  p.num_blocks = t[kK]->dims[0];
  p.block_size = t[kK]->dims[2];
  p.blocks = t[kBlockTable]->dims[2];
  p.s_kv = p.blocks * p.block_size;
}

// Output `s` is writable and shares no memory with any input or earlier output.
void check_output(Validator& check, GraphOp op, const TensorView* const* t, int s) {
  check.writable(*t[s]);
  for (int other = 0; other < kNumSlots; ++other) {
    const Role role = role_in(op, other);
    if (t[other] && (role == Role::input || (role == Role::output && other < s))) check.disjoint(*t[s], *t[other]);
  }
}

}  // namespace

// Every rule, walking the operand table: per-operand checks, shapes against what q, k and v
// establish, then memory rules, then outputs writable and disjoint from every input and from
// each other.
Problem validate_call(const CallOperands& call) {
  const GraphOp op = call.op;
  Validator check;
  const TensorView* t[kNumSlots] = {};      // the operands present, each as its 4-axis view
  SlotViews as4;                            // the 4-axis views of the slots present
  const TensorView* given[kNumSlots] = {};  // the op's operands (null where it has no such slot)
  const bool ragged = is_ragged(call);
  for (int s = 0; s < kNumSlots; ++s) {
    if (role_in(op, s) == Role::absent) {
      if (call.slot[s].present) {
        throw LayoutError(std::string(kOperands[s].name) + " is not an operand of the " +
                          (op == GraphOp::forward ? "forward" : "backward") + " call.");
      }
      continue;
    }
    given[s] = &call.slot[s];
    if (optional_in(op, s) && !given[s]->present) continue;
    switch (kOperands[s].kind) {
      case OperandKind::attention:
        if (ragged)
          check.thd_operand(*given[s]);
        else
          check.operand(*given[s]);
        break;
      case OperandKind::stats:
        if (ragged)
          check.thd_stats(*given[s]);
        else
          check.stats(*given[s]);
        break;
      case OperandKind::cumulative:
        check.cumulative(*given[s]);
        break;
      case OperandKind::page_table:
        check.page_table(*given[s]);
        break;
      case OperandKind::lengths:
        check.lengths(*given[s]);
        break;
      case OperandKind::per_head:
        check.per_head(*given[s]);
        break;
      case OperandKind::scores:
        check.scores(*given[s]);
        break;
      case OperandKind::philox:
        check.philox(*given[s]);
        break;
      case OperandKind::fp8_scale:
        check.fp8_scale(*given[s]);
        break;
    }
    t[s] = as4.put(s, as_4d(*given[s], kOperands[s].kind, ragged));
  }
  if (ragged) check_ragged_operands(t);
  for (int s = kQ + 1; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (t[s]) check.same_device_and_dtype(*t[kQ], *t[s], kind == OperandKind::attention || kind == OperandKind::scores);
  }

  const bool paged = t[kBlockTable] != nullptr;
  Problem p = problem_from(*t[kQ], *t[kK], *t[kV], paged);  // q, k and v agree with each other
  if (paged) set_paged(p, t);
  p.rng_state = t[kRngState] != nullptr;
  if (ragged) {
    p.ragged = true;
    p.sequences = t[kCuSeqlensQ]->dims[3] - 1;
  }
  bool every_output_empty = true;
  for (int s = kV + 1; s < kNumSlots; ++s) {
    if (!t[s]) continue;
    int64_t expected[4];
    for (int axis = 0; axis < 4; ++axis) expected[axis] = p.extent(kOperands[s].shape[axis]);
    if (s == kGradBias && !t[kBias]) {
      throw LayoutError("grad_bias is given without bias; the bias' gradient needs the bias itself.");
    }
    if (kOperands[s].kind == OperandKind::scores) {
      check.scores_shape(*t[s], expected, s == kGradBias ? t[kBias] : nullptr);
    } else {
      check.shape(*t[s], expected, kOperands[s].shape_meaning);
    }
    // The sinks' or a shared bias' gradient of an empty problem is zeros (filled by the plan), not
    // work for cuDNN.
    const bool per_head_or_scores =
        kOperands[s].kind == OperandKind::per_head || kOperands[s].kind == OperandKind::scores;
    if (role_in(op, s) == Role::output && t[s]->numel() != 0 && !per_head_or_scores) {
      every_output_empty = false;
    }
  }
  if (t[kGradSinks] && !t[kSinks]) {
    throw LayoutError("grad_sinks is given without sinks; the sinks' gradient needs the sinks themselves.");
  }
  const int64_t seqs[2] = {p.s_q, p.s_kv};
  if (every_output_empty) {
    // Only a sinks' or a shared bias' gradient can have elements: zero-filled, so checked as any
    // output is before it is written.
    for (int s : {kGradSinks, kGradBias}) {
      if (!t[s] || t[s]->numel() == 0) continue;
      if (s == kGradBias) check.scores_memory(*t[s], true, seqs, t[kBias]);
      check_output(check, op, t, s);
    }
    p.nothing_to_do = true;
    return p;
  }
  require_nonempty_problem(p);
  if (ragged) {
    require_int32_offsets(t);
    require_dense_queries(t, op == GraphOp::backward);
  }

  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (t[s] && (kind == OperandKind::attention || kind == OperandKind::stats)) {
      check.memory(*t[s], role_in(op, s) == Role::output, kind == OperandKind::stats);
    }
    if (t[s] && kind == OperandKind::scores) {
      check.scores_memory(*t[s], role_in(op, s) == Role::output, seqs, s == kGradBias ? t[kBias] : nullptr);
    }
  }
  if (op == GraphOp::backward && quirk_applies(Quirk::backward_32bit_reach)) {
    for (int s = 0; s < kNumSlots; ++s) {
      if (t[s] && kOperands[s].backward_reach != Reach::unlimited) {
        require_32bit_reach(*t[s], kOperands[s].backward_reach == Reach::bytes_2_32);
      }
    }
  }
  for (int s = 0; s < kNumSlots; ++s) {
    if (t[s] && role_in(op, s) == Role::output) check_output(check, op, t, s);
  }
  return p;
}

void validate_options(const SdpaOptions& options, const Problem& p) {
  // Only a boundary that carries the options as codes (the JAX handlers' attribute) can get this wrong.
  if (options.alignment != CausalAlignment::top_left && options.alignment != CausalAlignment::bottom_right) {
    throw LayoutError("unknown causal_alignment code " + std::to_string(static_cast<int64_t>(options.alignment)) +
                      " (0: top_left, 1: bottom_right)");
  }
  if (options.dropout_p > 0 && !p.rng_state) {
    throw LayoutError(
        "dropout_p > 0 needs rng_state, an int64 (2,) device tensor holding the Philox seed and offset "
        "(the framework adapters draw it from their generator); pass the same rng_state to the backward.");
  }
  if (options.has_scale && !std::isfinite(options.scale)) {
    throw LayoutError("scale must be a finite number, got " + std::to_string(options.scale));
  }
  // cuDNN's padded extents are int; 0 bounds a varlen call by its token count.
  if (options.max_seqlen_q < 0 || options.max_seqlen_kv < 0 || options.max_seqlen_q > INT32_MAX ||
      options.max_seqlen_kv > INT32_MAX) {
    throw LayoutError("max_seqlen_q / max_seqlen_kv must be in [1, 2^31) or 0 (bounded by the token count)");
  }
  // cuDNN takes dropout_p as a float32: it must stay a probability in (0, 1) after the conversion.
  const float dropout32 = static_cast<float>(options.dropout_p);
  if (!(options.dropout_p >= 0 && options.dropout_p < 1) ||
      (options.dropout_p > 0 && !(dropout32 > 0 && dropout32 < 1))) {
    throw LayoutError(
        "dropout_p must be a probability in [0, 1) that stays one as a float32 (from 1.4e-45 to "
        "1 - 6e-8), got " +
        std::to_string(options.dropout_p));
  }
  if (options.window_left < SdpaOptions::kUnbounded || options.window_right < SdpaOptions::kUnbounded) {
    throw LayoutError("window bounds must be non-negative token counts (or None for unbounded), got (" +
                      std::to_string(options.window_left) + ", " + std::to_string(options.window_right) + ")");
  }
  // The cap reaches cuDNN as a float32: it must be one (neither 0 nor inf after the conversion).
  if (options.softcap != 0 &&
      !(options.softcap >= std::numeric_limits<float>::min() && options.softcap <= std::numeric_limits<float>::max())) {
    throw LayoutError("softcap must be a positive finite float32 (between 1.2e-38 and 3.4e38; None for no cap), got " +
                      std::to_string(options.softcap));
  }
  // cuDNN takes window bounds as int, and the left bound as left + 1.
  if (options.window_left >= INT32_MAX || options.window_right >= INT32_MAX) {
    throw LayoutError("window bounds must be below 2^31 - 1 tokens (use None for unbounded)");
  }
}

}  // namespace stridedfa
