// Variable-length (THD) calls in the validator: whether a call is one, how its (tokens, heads,
// dim) operands become the core's one-batch (1, h, tokens, d) views, and the rules the dense
// validator does not already apply to those views. validate.cpp calls these; ragged.hpp says how
// such calls reach cuDNN.
#pragma once

#include "stridedfa/sdpa_types.hpp"

namespace stridedfa {

// Whether a call is variable-length: cu_seqlens given (both sides are then required).
bool is_ragged(const CallOperands& call);

// A (tokens, heads, dim) operand -- or, with `stats`, (heads, tokens) statistics -- as the core's
// (1, h, tokens, d) view: the seq axis is the token axis, so every memory rule applies to the
// caller's real memory (the sequences are cut out of it at launch).
TensorView thd_as_4d(const TensorView& thd, bool stats);

// Both cu_seqlens, of one length; no padding lengths, bias or ALiBi (t: the 4-axis views).
void check_ragged_operands(const TensorView* const* t);

// cuDNN's ragged offsets are int32 elements: every start an operand's sequences can have must fit.
void require_int32_offsets(const TensorView* const* t);

// A backward's q and grad_q must be dense token-major (cuDNN quirk varlen_backward_dense_queries).
void require_dense_queries(const TensorView* const* t, bool backward);

}  // namespace stridedfa
