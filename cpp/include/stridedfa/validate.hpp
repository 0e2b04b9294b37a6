// Validation: every rule a call's operands and options must meet before anything is built or
// launched (validate.cpp, walking the operand table with the per-operand rules of
// operand_rules.hpp; validate_ragged.hpp for variable-length calls). Needs no GPU and no cuDNN.
#pragma once

#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// The softmax statistics may be given as (b, h, s) or (b, h, s, 1), padding lengths as (b,) or
// (b, 1, 1, 1); the core always uses 4 axes. In a variable-length call (`ragged`) the attention
// operands are (tokens, h, d) and the statistics (h, tokens): (1, h, tokens, d) and (1, h, tokens, 1).
TensorView stats_as_4d(const TensorView& lse);
TensorView as_4d(const TensorView& t, OperandKind kind, bool ragged = false);

// Whether an attention input (4 axes, or a variable-length call's 3, float16/bfloat16) meets the stride and alignment
// rules cuDNN reads by: what adapters ask before copying a gradient that autograd handed over (a broadcast dO from
// out.sum().backward(), say). The validator's own rule, so the two cannot drift apart.
bool cudnn_can_read(const TensorView& t);

// A call's operands as the core's 4-axis views, in slot order (null where not given): what the
// plan, the cache key and the graph read once validation has passed.
struct OperandViews {
  SlotViews views;  // the slots present only
  const TensorView* slots[kNumSlots] = {};
  explicit OperandViews(const CallOperands& call);
  OperandViews(const OperandViews&) = delete;  // slots point into this object
  OperandViews& operator=(const OperandViews&) = delete;
};

// Validation alone (throws LayoutError / UnsupportedError). Needs no GPU and no cuDNN.
Problem validate_call(const CallOperands& call);
// The options' rules, given what validation established: a finite scale, window bounds >= 0.
void validate_options(const SdpaOptions& options, const Problem& problem);

}  // namespace stridedfa
