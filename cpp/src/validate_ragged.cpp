// The rules of variable-length (THD) calls that the rest of the validator does not already apply
// to their one-batch (1, h, tokens, d) views (validate_ragged.hpp).
#include "stridedfa/validate_ragged.hpp"

#include <cstdint>
#include <string>

#include "stridedfa/errors.hpp"
#include "stridedfa/cudnn_quirks.hpp"

namespace stridedfa {

bool is_ragged(const CallOperands& call) { return call.slot[kCuSeqlensQ].present || call.slot[kCuSeqlensKV].present; }

// What a variable-length call needs and what it cannot take (t: the operands as 4-axis views).
void check_ragged_operands(const TensorView* const* t) {
  if (!t[kCuSeqlensQ] || !t[kCuSeqlensKV]) {
    throw LayoutError(std::string("a variable-length call needs both cu_seqlens_q and cu_seqlens_kv (") +
                      (t[kCuSeqlensQ] ? "cu_seqlens_kv" : "cu_seqlens_q") +
                      " is missing); for self-attention pass the same tensor twice.");
  }
  if (t[kCuSeqlensQ]->dims[3] != t[kCuSeqlensKV]->dims[3]) {
    throw LayoutError("cu_seqlens_q has " + std::to_string(t[kCuSeqlensQ]->dims[3]) + " entries but cu_seqlens_kv " +
                      std::to_string(t[kCuSeqlensKV]->dims[3]) + "; both hold batch + 1 starts.");
  }
  for (int s : {kSeqLensQ, kSeqLensKV}) {
    if (t[s]) {
      throw LayoutError(std::string(kOperands[s].name) +
                        " (padding lengths) cannot be combined with cu_seqlens: a variable-length call's "
                        "lengths are the differences of its cumulative starts.");
    }
  }
  for (int s : {kBias, kGradBias, kAlibiSlopes}) {
    if (t[s]) {
      throw UnsupportedError(std::string(kOperands[s].name) +
                             " is not supported in a variable-length call (cuDNN's ragged layout takes no score "
                             "bias here); use padded (batch, heads, seq, dim) tensors with seqlens_q / seqlens_kv.");
    }
  }
}

// Quirk varlen_backward_dense_queries: in a variable-length backward only q and dQ must be dense
// token-major -- with q or dQ at any other strides (head-major, padded or wider token rows, a view
// of a qkv projection) dQ came out wrong, with grouped heads dK or dV were overwritten, and one layout crashed the
// kernel (an illegal instruction); k, v, out, dO, dK and dV were right at every layout tried, and so was the forward.
// Refused by name.
void require_dense_queries(const TensorView* const* t, bool backward) {
  if (!backward || !quirk_applies(Quirk::varlen_backward_dense_queries)) return;
  for (int s : {kQ, kGradQ}) {
    const TensorView* x = t[s];
    if (!x || x->numel() == 0) continue;
    const int64_t h = x->dims[1], tokens = x->dims[2], d = x->dims[3];
    const bool dense =
        (d == 1 || x->strides[3] == 1) && (h == 1 || x->strides[1] == d) && (tokens == 1 || x->strides[2] == h * d);
    if (dense) continue;
    throw UnsupportedError(std::string(x->name) +
                           ": cuDNN's variable-length backward needs q and grad_q dense (tokens, heads, head_dim), "
                           "strides (" +
                           std::to_string(h * d) + ", " + std::to_string(d) + ", 1); this one has token stride " +
                           std::to_string(x->strides[2]) + ", head stride " + std::to_string(x->strides[1]) +
                           " and dim stride " + std::to_string(x->strides[3]) +
                           " (cuDNN 9.19 computes a wrong dQ otherwise). Pass q.contiguous() and a "
                           "contiguous grad_q; stridedfa.torch and stridedfa.cupy do so themselves." +
                           quirk_tag(Quirk::varlen_backward_dense_queries));
  }
}

// cuDNN takes the ragged offsets (a sequence's start times the token stride) as int32: every
// element a ragged operand's sequences can start at must lie within 2^31 - 1 elements.
void require_int32_offsets(const TensorView* const* t) {
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!t[s] || (kind != OperandKind::attention && kind != OperandKind::stats) || t[s]->numel() == 0) continue;
    const int64_t tokens = t[s]->dims[2], stride = t[s]->strides[2];
    const int64_t reach = tokens > 1 ? tokens * stride : 0;
    if (reach <= INT32_MAX && element_extent(*t[s]) <= INT32_MAX) continue;
    throw UnsupportedError(std::string(t[s]->name) + ": " + std::to_string(tokens) + " tokens at a token stride of " +
                           std::to_string(stride) +
                           " elements reach past 2^31 elements, the limit of cuDNN's int32 ragged offsets; split "
                           "the batch over several calls.");
  }
}

// A variable-length call's (tokens, heads, dim) operand, or its (heads, tokens) statistics, as the
// core's (batch, heads, seq, dim) with one batch entry: the seq axis is the token axis, so every
// memory rule applies to the caller's real memory (the sequences are cut out of it at launch).
TensorView thd_as_4d(const TensorView& thd, bool stats) {
  TensorView t = thd;
  t.ndim = 4;
  const int tokens = stats ? 1 : 0, heads = stats ? 0 : 1;
  const int64_t inner = stats ? 1 : thd.dims[2] * thd.strides[2];
  t.dims[0] = 1;
  t.strides[0] = inner * thd.dims[heads];  // extent 1: never stepped along
  t.caller_axes[0] = -1;
  t.dims[1] = thd.dims[heads];
  t.strides[1] = thd.strides[heads];
  // One head (MQA's k and v, their gradients): the head stride is free, and cuDNN lays out the
  // backward's grouped-head workspaces from it (part of cuDNN quirk varlen_backward_mqa_dk: dK wrong
  // with k, v or dK at a head stride other than d), so it says d, as a dense (tokens, 1, d) tensor's does.
  if (!stats && thd.dims[heads] == 1) t.strides[1] = thd.dims[2] * thd.strides[2];
  t.caller_axes[1] = thd.caller_axes[heads];
  t.dims[2] = thd.dims[tokens];
  t.strides[2] = thd.strides[tokens];
  t.caller_axes[2] = thd.caller_axes[tokens];
  t.dims[3] = stats ? 1 : thd.dims[2];
  t.strides[3] = stats ? 1 : thd.strides[2];
  t.caller_axes[3] = static_cast<int8_t>(stats ? -1 : thd.caller_axes[2]);
  return t;
}

}  // namespace stridedfa
