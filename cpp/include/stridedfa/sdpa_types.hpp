// The vocabulary every layer of the core shares -- options, the operand table, what validation
// establishes -- apart from the entry points (sdpa.hpp) so that the graph builder and the XLA FFI
// glue can use it without including them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

enum class CausalAlignment : int32_t { top_left = 0, bottom_right = 1 };

// The options of a call: one struct, parsed once at the boundary, written into the cache key
// (GraphSpec::write_key) and read by the graph builder.
struct SdpaOptions {
  bool has_scale = false;  // false: scale = 1 / sqrt(d_qk)
  double scale = 0.0;
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::top_left;
  // window=(left, right): query i sees key j iff i + off - left <= j <= i + off + right, with off
  // the alignment's diagonal offset (0, or s_kv - s_q bottom-right). kUnbounded: no bound there.
  int64_t window_left = kUnbounded, window_right = kUnbounded;
  bool deterministic = false;  // backward: a bitwise-reproducible algorithm
  double softcap = 0.0;        // > 0: scores -> softcap * tanh(scores / softcap) before the mask
  // > 0: each softmax probability is dropped with this probability and the kept ones scaled by
  // 1 / (1 - dropout_p), by cuDNN's Philox generator from the rng_state operand.
  double dropout_p = 0.0;
  // Variable-length (THD) calls: the longest sequence on each side, a promise; a sequence longer
  // than its bucket (ragged.hpp: at most 1.25x) is treated as empty. 0: bounded by the token count
  // (always kept). Graphs are keyed by the bucket, so a training run builds a bounded number.
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;

  static constexpr int64_t kUnbounded = -1;
  // The right bound in effect: causal caps it at 0.
  int64_t right_bound() const { return causal ? 0 : window_right; }
  int64_t left_bound() const { return window_left; }
};

// SdpaOptions' fields by name, for boundaries that carry them as named scalars instead of this
// struct: the JAX handlers' `options` attribute (jax_ffi.cpp decodes it) and Python's view of a
// parse (option_fields below, which stridedfa.jax encodes). X(wire type, field), the wire type
// bool, double or int64_t (an enum travels as its code). Every field, in declaration order: the
// static_asserts below fail otherwise.
#define STRIDEDFA_SDPA_OPTION_FIELDS(X) \
  X(bool, has_scale)                    \
  X(double, scale)                      \
  X(bool, causal)                       \
  X(int64_t, alignment)                 \
  X(int64_t, window_left)               \
  X(int64_t, window_right)              \
  X(bool, deterministic)                \
  X(double, softcap)                    \
  X(double, dropout_p)                  \
  X(int64_t, max_seqlen_q)              \
  X(int64_t, max_seqlen_kv)

namespace detail {
// SdpaOptions' member types in the list's order: its size and offsets match only if the list
// names every field, in order.
struct SdpaOptionsAsListed {
#define STRIDEDFA_AS_LISTED(wire, field) decltype(SdpaOptions::field) field;
  STRIDEDFA_SDPA_OPTION_FIELDS(STRIDEDFA_AS_LISTED)
#undef STRIDEDFA_AS_LISTED
};
}  // namespace detail
static_assert(sizeof(detail::SdpaOptionsAsListed) == sizeof(SdpaOptions),
              "STRIDEDFA_SDPA_OPTION_FIELDS must list every field of SdpaOptions");
#define STRIDEDFA_SAME_OFFSET(wire, field)                                                    \
  static_assert(offsetof(detail::SdpaOptionsAsListed, field) == offsetof(SdpaOptions, field), \
                "STRIDEDFA_SDPA_OPTION_FIELDS must list SdpaOptions' fields in order: " #field);
STRIDEDFA_SDPA_OPTION_FIELDS(STRIDEDFA_SAME_OFFSET)
#undef STRIDEDFA_SAME_OFFSET

// One field of a parsed SdpaOptions by name, with its wire type ('b' bool, 'd' double, 'i' int64).
struct OptionField {
  const char* name;
  char type;
  double real;      // 'd'
  int64_t integer;  // 'b' (0 or 1) and 'i'
};

template <typename Wire, typename Field>
OptionField option_field(const char* name, Field value) {
  if constexpr (std::is_same_v<Wire, double>) {
    return {name, 'd', static_cast<double>(value), 0};
  } else {
    return {name, std::is_same_v<Wire, bool> ? 'b' : 'i', 0.0, static_cast<int64_t>(value)};
  }
}

// Every field of `options`, in the list's order.
inline std::vector<OptionField> option_fields(const SdpaOptions& options) {
  std::vector<OptionField> fields;
#define STRIDEDFA_FIELD(wire, field) fields.push_back(option_field<wire>(#field, options.field));
  STRIDEDFA_SDPA_OPTION_FIELDS(STRIDEDFA_FIELD)
#undef STRIDEDFA_FIELD
  return fields;
}

enum class GraphOp : int64_t { forward = 1, backward = 2 };

// Operand slots, in the order of kOperands; the cuDNN tensor UID of a slot is slot + 1.
enum Slot : int {
  kQ = 0,
  kK,
  kV,
  kO,
  kLse,
  kGradO,
  kGradQ,
  kGradK,
  kGradV,
  kSeqLensQ,
  kSeqLensKV,
  kSinks,
  kGradSinks,
  kBias,
  kGradBias,
  kAlibiSlopes,
  kRngState,
  kCuSeqlensQ,
  kCuSeqlensKV,
  kBlockTable,
  // FP8 attention's scaling operands (cuDNN's sdpa_fp8 names): the descale of each FP8 input, the
  // scale of each FP8 output and of the intermediate S = softmax(QK^T) and dP, and the absolute
  // maxima cuDNN measures for the next step's scales. Reserved: the validator refuses them until
  // FP8 attention lands (issue 34), which adds their graph lines.
  kDescaleQ,
  kDescaleK,
  kDescaleV,
  kDescaleO,
  kDescaleGradO,
  kDescaleS,
  kDescaleDP,
  kScaleS,
  kScaleO,
  kScaleDP,
  kScaleGradQ,
  kScaleGradK,
  kScaleGradV,
  kAmaxS,
  kAmaxO,
  kAmaxDP,
  kAmaxGradQ,
  kAmaxGradK,
  kAmaxGradV,
  kNumSlots
};

// rng_state holds two int64 values, the Philox seed and offset, which cuDNN takes as two tensors:
// the seed gets the slot's UID (slot + 1), the offset this one; its pointer is the second element.
inline constexpr int kRngOffsetTensor = kNumSlots;
// A paged call gives cuDNN one page table for K and one for V: the block table's slot UID and this
// one, both pointing at the launch's range-checked copy of the caller's table.
inline constexpr int kPageTableV = kNumSlots + 1;
// A variable-length call describes each token-axis operand to cuDNN with a ragged offset tensor
// (each sequence's first element), made on the device at launch (ragged.hpp); its UID is
// kRaggedOffsetTensor + slot + 1, and operand_order names it kRaggedOffsetTensor + slot.
inline constexpr int kRaggedOffsetTensor = 64;
inline constexpr int kMaxGraphTensors = 2 * kNumSlots + 2;

enum class Role : int32_t { absent = 0, input = 1, output = 2 };

// attention: float16/bfloat16 shared by the call, 4 axes, head_dim contiguous, 16-byte rules.
// stats: float32 softmax statistics (batch, heads, seq) or with a trailing axis of 1.
// lengths: int32 per-batch sequence lengths, (batch,) or (batch, 1, 1, 1), contiguous, read on the
// device only.
// per_head: float32 one value per query head, (heads of q,), contiguous.
// philox: int64 (2,) on the device, the Philox seed and offset of dropout (any stride).
// cumulative: int32 (batch + 1,) sequence starts of a variable-length (THD) call, contiguous, read
// on the device only; with them the attention operands are (tokens, heads, head_dim) and the
// statistics (heads, tokens).
// page_table: int32 (batch, blocks per sequence) of a paged KV cache, each row contiguous;
// with it k and v are caches of (num_blocks, heads of k, block_size, head_dim) and seqlens_kv the
// cached length of each sequence. Read on the device only, every id clamped into the cache.
// fp8_scale: one float32 on the device, (1,): an FP8 operand's scale or descale, or an amax
// output (reserved until FP8 attention lands).
// scores: one value per score, the attention dtype, broadcastable to (batch, heads of q, seq of q,
// seq of k) (NumPy rules: fewer axes are leading 1s; an axis of extent 1 or stride 0 is shared).
enum class OperandKind : int32_t {
  attention = 0,
  stats = 1,
  lengths = 2,
  per_head = 3,
  scores = 4,
  philox = 5,
  cumulative = 6,
  page_table = 7,
  fp8_scale = 8
};

// The logical extents an operand's axes must have (kOne: extent 1, kTwo: extent 2).
// kBatchPlusOne: the cumulative starts' (batch + 1) entries; kBlocks: a paged call's blocks per sequence.
enum Extent : int32_t {
  kBatch = 0,
  kHeadsQ,
  kHeadsKV,
  kSeqQ,
  kSeqKV,
  kDimQK,
  kDimV,
  kOne,
  kTwo,
  kBatchPlusOne,
  kBlocks
};

// How far cuDNN's backward can address an operand from its data pointer (validate.cpp says why).
enum class Reach : int32_t { unlimited = 0, elements_2_32 = 1, bytes_2_32 = 2 };

// One row per operand: the validator, the cache key, the graph builder and the Cython boundary
// all walk this table, so a new operand is one row plus the lines that put it into the graph.
struct OperandInfo {
  const char* name;                          // the argument name of sdpa_forward / sdpa_backward and in errors
  Role forward, backward;                    // its role in each op
  bool forward_optional, backward_optional;  // the op may leave it out
  OperandKind kind;
  Extent shape[4];            // its logical (b, h, s, d) extents
  const char* shape_meaning;  // how shape errors describe them
  Reach backward_reach;
};

// clang-format off: one row per line reads as a table
inline constexpr OperandInfo kOperands[kNumSlots] = {
    {"q", Role::input, Role::input, false, false, OperandKind::attention, {kBatch, kHeadsQ, kSeqQ, kDimQK},
     "(batch, heads of q, seq of q, head_dim of q)", Reach::elements_2_32},
    {"k", Role::input, Role::input, false, false, OperandKind::attention, {kBatch, kHeadsKV, kSeqKV, kDimQK},
     "(batch, heads of k, seq of k, head_dim of q)", Reach::elements_2_32},
    {"v", Role::input, Role::input, false, false, OperandKind::attention, {kBatch, kHeadsKV, kSeqKV, kDimV},
     "(batch, heads of k, seq of k, head_dim of v)", Reach::elements_2_32},
    {"out", Role::output, Role::input, false, false, OperandKind::attention, {kBatch, kHeadsQ, kSeqQ, kDimV},
     "(batch, heads of q, seq of q, head_dim of v)", Reach::bytes_2_32},
    {"lse", Role::output, Role::input, true, false, OperandKind::stats, {kBatch, kHeadsQ, kSeqQ, kOne},
     "(batch, heads of q, seq of q, 1)", Reach::unlimited},
    {"grad_out", Role::absent, Role::input, false, false, OperandKind::attention, {kBatch, kHeadsQ, kSeqQ, kDimV},
     "out's shape (batch, heads of q, seq of q, head_dim of v)", Reach::bytes_2_32},
    {"grad_q", Role::absent, Role::output, false, false, OperandKind::attention, {kBatch, kHeadsQ, kSeqQ, kDimQK},
     "q's shape", Reach::elements_2_32},
    {"grad_k", Role::absent, Role::output, false, false, OperandKind::attention, {kBatch, kHeadsKV, kSeqKV, kDimQK},
     "k's shape", Reach::elements_2_32},
    {"grad_v", Role::absent, Role::output, false, false, OperandKind::attention, {kBatch, kHeadsKV, kSeqKV, kDimV},
     "v's shape", Reach::elements_2_32},
    {"seqlens_q", Role::input, Role::input, true, true, OperandKind::lengths, {kBatch, kOne, kOne, kOne},
     "(batch,)", Reach::unlimited},
    {"seqlens_kv", Role::input, Role::input, true, true, OperandKind::lengths, {kBatch, kOne, kOne, kOne},
     "(batch,)", Reach::unlimited},
    {"sinks", Role::input, Role::input, true, true, OperandKind::per_head, {kOne, kHeadsQ, kOne, kOne},
     "(heads of q,)", Reach::unlimited},
    {"grad_sinks", Role::absent, Role::output, false, true, OperandKind::per_head, {kOne, kHeadsQ, kOne, kOne},
     "sinks' shape (heads of q,)", Reach::unlimited},
    {"bias", Role::input, Role::input, true, true, OperandKind::scores, {kBatch, kHeadsQ, kSeqQ, kSeqKV},
     "(batch or 1, heads of q or 1, seq of q or 1, seq of k)", Reach::unlimited},
    {"grad_bias", Role::absent, Role::output, false, true, OperandKind::scores, {kBatch, kHeadsQ, kSeqQ, kSeqKV},
     "bias' shape", Reach::unlimited},
    {"alibi_slopes", Role::input, Role::input, true, true, OperandKind::per_head, {kOne, kHeadsQ, kOne, kOne},
     "(heads of q,)", Reach::unlimited},
    {"rng_state", Role::input, Role::input, true, true, OperandKind::philox, {kOne, kOne, kOne, kTwo},
     "(2,): the Philox seed and offset", Reach::unlimited},
    {"cu_seqlens_q", Role::input, Role::input, true, true, OperandKind::cumulative, {kOne, kOne, kOne, kBatchPlusOne},
     "(batch + 1,): 0, then each query sequence's end", Reach::unlimited},
    {"cu_seqlens_kv", Role::input, Role::input, true, true, OperandKind::cumulative, {kOne, kOne, kOne, kBatchPlusOne},
     "(batch + 1,): 0, then each key sequence's end", Reach::unlimited},
    {"block_table", Role::input, Role::absent, true, false, OperandKind::page_table, {kBatch, kOne, kBlocks, kOne},
     "(batch, blocks per sequence)", Reach::unlimited},
    {"descale_q", Role::input, Role::input, true, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_k", Role::input, Role::input, true, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_v", Role::input, Role::input, true, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_out", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_grad_out", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_s", Role::input, Role::input, true, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"descale_dp", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_s", Role::input, Role::input, true, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_out", Role::input, Role::absent, true, false, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_dp", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_grad_q", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_grad_k", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"scale_grad_v", Role::absent, Role::input, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_s", Role::output, Role::absent, true, false, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_out", Role::output, Role::absent, true, false, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_dp", Role::absent, Role::output, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_grad_q", Role::absent, Role::output, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_grad_k", Role::absent, Role::output, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
    {"amax_grad_v", Role::absent, Role::output, false, true, OperandKind::fp8_scale, {kOne, kOne, kOne, kOne}, "(1,)", Reach::unlimited},
};
// clang-format on

inline Role role_in(GraphOp op, int slot) {
  return op == GraphOp::forward ? kOperands[slot].forward : kOperands[slot].backward;
}
inline bool optional_in(GraphOp op, int slot) {
  return op == GraphOp::forward ? kOperands[slot].forward_optional : kOperands[slot].backward_optional;
}

// One call: its op and its operands in the table's slot order (slot[s] is what kOperands[s]
// describes; present == false where not given). Every entry point fills the slots by their names
// in the table (kQ, kSinks, ...); nothing else restates which operands a call has.
struct CallOperands {
  GraphOp op = GraphOp::forward;
  TensorView slot[kNumSlots];
};

// TensorViews for some of a call's slots, made where a slot gets one: the operand table's many
// rows that a call leaves absent cost nothing (an array of TensorViews would initialise every one,
// ~7.5 KB, on every call; measured as a host-time regression once the FP8 rows were added).
class SlotViews {
 public:
  TensorView* put(int slot, const TensorView& view) { return ::new (cells_[slot].bytes) TensorView(view); }

 private:
  struct Cell {
    alignas(TensorView) unsigned char bytes[sizeof(TensorView)];
  };
  Cell cells_[kNumSlots];
};
static_assert(std::is_trivially_destructible_v<TensorView>, "SlotViews never destroys what it made");

// What validation established about a call.
struct Problem {
  int64_t b = 0, h_q = 0, h_kv = 0, s_q = 0, s_kv = 0, d_qk = 0, d_v = 0;
  int32_t device = 0;          // CUDA ordinal shared by every tensor
  DLDataType dtype{};          // float16 or bfloat16
  bool nothing_to_do = false;  // every output is empty: return without launching
  // A variable-length call: b sequences (cu_seqlens has b + 1 entries) packed along the token
  // axis, which the attention operands' seq axis then is (s_q, s_kv: the token counts).
  bool ragged = false;
  int64_t sequences = 0;
  // A paged call: k and v are caches of num_blocks blocks of block_size tokens; each sequence
  // reads `blocks` of them (s_kv: blocks * block_size).
  bool paged = false;
  int64_t num_blocks = 0, block_size = 0, blocks = 0;
  bool rng_state = false;  // dropout's Philox state was given (validate_options: dropout needs it)

  int64_t extent(Extent e) const {
    const int64_t values[] = {b, h_q, h_kv, s_q, s_kv, d_qk, d_v, 1, 2, sequences + 1, blocks};
    return values[e];
  }
};

}  // namespace stridedfa
