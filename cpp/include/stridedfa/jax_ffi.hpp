// The XLA FFI targets behind stridedfa.jax, and the one rule that turns an XLA buffer into the
// core's TensorView.
//
// XLA hands a custom call dense row-major buffers. stridedfa.jax accepts q/k/v arrays in two axis
// orders (a `layout` attribute): bshd arrays (batch, seq, heads, head_dim) and bhsd arrays
// (batch, heads, seq, head_dim). Either is a strided view of the core's logical (b, h, s, d) axes:
// for bshd the logical h axis has stride d and s has stride h * d, exactly like a torch
// `x.transpose(1, 2)` of a contiguous (b, s, h, d) tensor, so JAX, torch and sdpa_forward calls on
// the same problem share one cached cuDNN graph. Axes in front of the last three (vmap's batch axes)
// fold into the batch axis, which a row-major buffer allows. The softmax statistics are float32
// (b..., h, s), row-major.
//
// This header keeps XLA's headers out of everything but jax_ffi.cpp; jaxlib is never linked (the
// handlers reach XLA only through the XLA_FFI_Api table it passes in each call frame).
#pragma once

#include <cstdint>
#include <string>

#include "stridedfa/errors.hpp"
#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa::jax_ffi {

// Values of the handlers' `layout` attribute.
// thd: a variable-length call's (tokens, heads, head_dim) arrays, exactly as given (no vmap axes).
enum class ArrayLayout : int64_t { bshd = 0, bhsd = 1, thd = 2 };

// The (b, h, s, d) view of a dense row-major q/k/v/out-like buffer of `rank` >= 4 dims in `layout`.
// Throws LayoutError for a rank below 4 or an unknown layout.
TensorView array_view(const char* name, const int64_t* dims, int64_t rank, ArrayLayout layout, DLDataType dtype,
                      int32_t device, std::uintptr_t data);

// The (b, h, s) view of dense row-major float32 statistics of `rank` >= 3 dims (leading axes fold
// into b). Throws LayoutError for a rank below 3.
TensorView stats_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                      std::uintptr_t data);

// A variable-length call's statistics: a dense row-major float32 (tokens, heads) buffer as the
// core's (heads, tokens) view (token-major memory: strides (1, heads)). Throws LayoutError unless
// the rank is 2.
TensorView thd_stats_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                          std::uintptr_t data);

// The (b,) view of dense int32 per-sequence lengths of any rank >= 1 (vmap's axes fold into b, in
// the order the batch of array_view folds them).
TensorView lengths_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                        std::uintptr_t data);

// The (h_q,) view of dense float32 per-head values (attention sinks and their gradient). Under
// vmap the sinks are shared by every folded batch (a rank above 1 is refused).
TensorView per_head_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                         std::uintptr_t data);

// The view of a dense row-major score bias (or its gradient) of `rank` dims: the caller's own 1-4
// axes, broadcastable to (b, h_q, s_q, s_kv) (the core adds the missing leading axes of 1), after
// `mapped` leading axes jax.vmap added (as many as q's rank has above 4). Mapped axes fold into the
// batch axis together with the bias' own batch axis, as array_view folds q's; one stride can only
// say that when the bias has q's batch (`batch`: q's folded batch axis) or the mapped axes hold one
// call. Throws LayoutError otherwise (a bias shared across the batch, under jax.vmap), and for more
// than kMaxDims axes.
TensorView scores_view(const char* name, const int64_t* dims, int64_t rank, int64_t mapped, int64_t batch,
                       DLDataType dtype, int32_t device, std::uintptr_t data);

// The view of dense ALiBi slopes of `rank` dims as given: the validator checks for float32 (h_q,).
// Under jax.vmap they keep their own axes: stridedfa.jax batches the calls with the slopes unmapped
// (shared by every folded batch), refusing mapped slopes while tracing. Throws LayoutError for more
// than kMaxDims axes.
TensorView slopes_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                       std::uintptr_t data);

// Dropout's Philox seed and offset as the core's int64 (2,) view. JAX without x64 has no int64, so
// stridedfa.jax passes jax.random.bits(key, (4,), jnp.uint32): four 32-bit words that the GPU
// (little-endian) reads as two int64 values, words 0-1 the seed and 2-3 the offset. Takes a (4,)
// uint32/int32 buffer, or a (2,) int64/uint64 one (x64 users); anything else throws LayoutError
// saying what is expected. Under jax.vmap it stays one state (unmapped).
TensorView rng_state_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                          std::uintptr_t data);

// A paged call's block table: a dense row-major int32 (batch, blocks per sequence) buffer as given
// (the core reads it as its page table). Throws LayoutError unless the rank is 2.
TensorView block_table_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                            std::uintptr_t data);

// The handlers' `optional_operands` attribute (i64): which optional operands follow the fixed
// ones, one bit each, `1 << slot` of the operand's row in kOperands, and they follow in the table's
// order (seqlens_q, seqlens_kv, sinks, bias, alibi_slopes, rng_state, cu_seqlens_q, cu_seqlens_kv,
// block_table); the backward's optional results (grad_sinks, grad_bias) likewise, after grad_v. The
// table says which operands a handler takes: the inputs of its op other than the fixed attention
// tensors, and the backward's per-head and score gradients; the FP8 rows not yet (issue 34). Which
// combinations make a call is the validator's to say, as for every entry point.
constexpr int64_t optional_bit(int slot) { return int64_t{1} << slot; }

struct OptionalOperands {
  int arguments[kNumSlots] = {};  // slots of the trailing arguments, in order
  int num_arguments = 0;
  int results[kNumSlots] = {};  // slots of the backward's trailing results, in order
  int num_results = 0;
};

// The slots `present` announces for a handler of `op`; throws LayoutError naming the bits that no
// such handler takes.
inline OptionalOperands optional_operands(int64_t present, GraphOp op) {
  OptionalOperands given;
  int64_t taken = 0;
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (kind == OperandKind::attention || kind == OperandKind::stats || kind == OperandKind::fp8_scale) continue;
    const Role role = role_in(op, s);
    if (role == Role::absent) continue;
    taken |= optional_bit(s);
    if (!(present & optional_bit(s))) continue;
    if (role == Role::input) {
      given.arguments[given.num_arguments++] = s;
    } else {
      given.results[given.num_results++] = s;
    }
  }
  if (present < 0 || (present & ~taken) != 0) {
    std::string names;
    for (int s = 0; s < kNumSlots && s < 63; ++s) {
      if (present & ~taken & optional_bit(s)) names += std::string(names.empty() ? "" : ", ") + kOperands[s].name;
    }
    throw LayoutError("optional_operands " + std::to_string(present) + " announces operands the " +
                      (op == GraphOp::forward ? "forward" : "backward") + " handler does not take" +
                      (names.empty() ? std::string() : ": " + names) +
                      " (bit 1 << slot of each optional operand of its op, cpp/include/stridedfa/sdpa_types.hpp)");
  }
  return given;
}

// The handlers, as XLA_FFI_Handler* (void* keeps XLA's types out of this header). Attributes:
// options (a dictionary of SdpaOptions' fields by name and wire type, STRIDEDFA_SDPA_OPTION_FIELDS
// in sdpa_types.hpp: what _core._sdpa_options gives for the call), layout (i64: ArrayLayout) and
// optional_operands (i64: the optional_bit of each trailing argument given). Each takes the
// optional trailing arguments in this order: (q, k, v[, seqlens_q, seqlens_kv][, sinks][, bias]
// [, alibi_slopes][, rng_state][, cu_seqlens_q, cu_seqlens_kv][, block_table]) -> (out, lse)
void* forward_handler();
void* forward_inference_handler();  // (q, k, v[, ...]) -> (out): no statistics (cuDNN's inference graph)
// (q, k, v, out, lse, grad_out[, ...]) -> (grad_q, grad_k, grad_v[, grad_sinks][, grad_bias])
void* backward_handler();

}  // namespace stridedfa::jax_ffi
