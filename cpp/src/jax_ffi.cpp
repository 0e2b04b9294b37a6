// XLA FFI handlers for stridedfa.jax: XLA's buffers become TensorViews, then the same
// prepare -> graph cache -> execute path as every other call. Deliberately light: no
// cudnn_frontend.h here, only XLA's three FFI API headers (from jaxlib, at build time).
#include "stridedfa/jax_ffi.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "stridedfa/errors.hpp"
#include "stridedfa/sdpa.hpp"
#include "xla/ffi/api/ffi.h"

// CUDA declares cudaStream_t as `struct CUstream_st*`; PlatformStream needs only that pointer type,
// so the CUDA headers stay out of this file.
struct CUstream_st;

namespace ffi = xla::ffi;

// The handlers' `options` attribute, decoded by XLA into the core's SdpaOptions: a dictionary of
// its fields by name (the one list, STRIDEDFA_SDPA_OPTION_FIELDS), as stridedfa.jax encodes the
// core's own parse of them. Decoded with the other arguments, so a missing field or a wrong type is
// reported by XLA's decoding, before the handler runs; values are checked by the validator, as
// every entry point's are.
namespace xla::ffi {
template <>
struct AttrDecoding<stridedfa::SdpaOptions> {
  using Type = stridedfa::SdpaOptions;
  static std::optional<Type> Decode(XLA_FFI_AttrType type, void* attr, DiagnosticEngine& diagnostic) {
    if (type != XLA_FFI_AttrType_DICTIONARY) {
      diagnostic.Emit("options: expected a dictionary of the call's options");
      return std::nullopt;
    }
    const Dictionary fields(reinterpret_cast<XLA_FFI_Attrs*>(attr));
    Type options;
    bool decoded = true;
#define STRIDEDFA_DECODE(wire, field)                                   \
  if (auto value = fields.get<wire>(#field); value.has_value()) {       \
    options.field = static_cast<decltype(options.field)>(*value);       \
  } else {                                                              \
    diagnostic.Emit("options." #field ": ") << value.error().message(); \
    decoded = false;                                                    \
  }
    STRIDEDFA_SDPA_OPTION_FIELDS(STRIDEDFA_DECODE)
#undef STRIDEDFA_DECODE
    if (!decoded) return std::nullopt;
    return options;
  }
};
}  // namespace xla::ffi

namespace stridedfa::jax_ffi {
namespace {

// A view of a dense XLA buffer with its dims and strides still to fill in.
TensorView dense_view(const char* name, int32_t ndim, DLDataType dtype, int32_t device, std::uintptr_t data) {
  TensorView t;
  t.name = name;
  t.present = true;
  t.ndim = ndim;
  t.dtype = dtype;
  t.device_type = kDLCUDA;
  t.device_id = device;
  t.data = data;
  return t;
}

}  // namespace

TensorView array_view(const char* name, const int64_t* dims, int64_t rank, ArrayLayout layout, DLDataType dtype,
                      int32_t device, std::uintptr_t data) {
  if (layout == ArrayLayout::thd) {  // (tokens, heads, dim), row-major, as given
    if (rank != 3) {
      throw LayoutError(std::string(name) + ": expected a (tokens, heads, head_dim) array, got " +
                        std::to_string(rank) + " axes");
    }
    TensorView t = dense_view(name, 3, dtype, device, data);
    for (int i = 0; i < 3; ++i) t.dims[i] = dims[i];
    t.strides[0] = dims[1] * dims[2];
    t.strides[1] = dims[2];
    t.strides[2] = 1;
    return t;
  }
  if (rank < 4) {
    throw LayoutError(std::string(name) + ": expected an array of 4 axes, got " + std::to_string(rank));
  }
  if (layout != ArrayLayout::bshd && layout != ArrayLayout::bhsd) {
    throw LayoutError("unknown array layout code " + std::to_string(static_cast<int64_t>(layout)) +
                      " (0: bshd, 1: bhsd, 2: thd)");
  }
  int64_t batch = 1;
  for (int64_t i = 0; i < rank - 3; ++i) batch *= dims[i];
  const int64_t outer = dims[rank - 3], inner = dims[rank - 2], d = dims[rank - 1];
  const bool bshd = layout == ArrayLayout::bshd;
  const int64_t h = bshd ? inner : outer, s = bshd ? outer : inner;
  TensorView t = dense_view(name, 4, dtype, device, data);
  const int64_t logical[4] = {batch, h, s, d};
  const int64_t strides[4] = {outer * inner * d, bshd ? d : s * d, bshd ? h * d : d, 1};
  // The array's own axis numbers for messages (the batch axes are folded into axis 0).
  const int64_t caller[4] = {0, bshd ? rank - 2 : rank - 3, bshd ? rank - 3 : rank - 2, rank - 1};
  for (int i = 0; i < 4; ++i) {
    t.dims[i] = logical[i];
    t.strides[i] = strides[i];
    t.caller_axes[i] = static_cast<int8_t>(caller[i]);
  }
  return t;
}

TensorView stats_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                      std::uintptr_t data) {
  if (rank < 3) {
    throw LayoutError(std::string(name) + ": expected statistics of 3 axes (batch, heads, seq), got " +
                      std::to_string(rank));
  }
  int64_t batch = 1;
  for (int64_t i = 0; i < rank - 2; ++i) batch *= dims[i];
  const int64_t h = dims[rank - 2], s = dims[rank - 1];
  TensorView t = dense_view(name, 3, dtype, device, data);
  const int64_t logical[3] = {batch, h, s};
  const int64_t strides[3] = {h * s, s, 1};
  for (int i = 0; i < 3; ++i) {
    t.dims[i] = logical[i];
    t.strides[i] = strides[i];
  }
  return t;
}

TensorView thd_stats_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                          std::uintptr_t data) {
  if (rank != 2) {
    throw LayoutError(std::string(name) + ": expected variable-length statistics (tokens, heads), got " +
                      std::to_string(rank) + " axes");
  }
  TensorView t = dense_view(name, 2, dtype, device, data);
  t.dims[0] = dims[1];  // the core's (heads, tokens) over the buffer's token-major memory
  t.dims[1] = dims[0];
  t.strides[0] = 1;
  t.strides[1] = dims[1];
  t.caller_axes[0] = 1;
  t.caller_axes[1] = 0;
  return t;
}

TensorView per_head_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                         std::uintptr_t data) {
  if (rank != 1)
    throw LayoutError(std::string(name) + ": expected a (heads of q,) array, got " + std::to_string(rank) + " axes");
  TensorView t = dense_view(name, 1, dtype, device, data);
  t.dims[0] = dims[0];
  t.strides[0] = 1;
  return t;
}

TensorView lengths_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                        std::uintptr_t data) {
  if (rank < 1) throw LayoutError(std::string(name) + ": expected a (batch,) array of lengths, got a scalar");
  TensorView t = dense_view(name, 1, dtype, device, data);
  t.dims[0] = 1;
  for (int64_t i = 0; i < rank; ++i) t.dims[0] *= dims[i];
  t.strides[0] = 1;
  return t;
}

TensorView block_table_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                            std::uintptr_t data) {
  if (rank != 2) {
    throw LayoutError(std::string(name) + ": expected a (batch, blocks per sequence) array, got " +
                      std::to_string(rank) + " axes");
  }
  TensorView t = dense_view(name, 2, dtype, device, data);
  t.dims[0] = dims[0];
  t.dims[1] = dims[1];
  t.strides[0] = dims[1];
  t.strides[1] = 1;
  return t;
}

namespace {
void require_rank_at_most_max(const char* name, int64_t rank) {
  if (rank > kMaxDims) {
    throw LayoutError(std::string(name) + ": " + std::to_string(rank) + " axes; stridedfa reads at most " +
                      std::to_string(kMaxDims));
  }
}
}  // namespace

TensorView slopes_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                       std::uintptr_t data) {
  require_rank_at_most_max(name, rank);
  TensorView t = dense_view(name, static_cast<int32_t>(rank), dtype, device, data);
  int64_t stride = 1;
  for (int64_t i = rank - 1; i >= 0; --i) {
    t.dims[i] = dims[i];
    t.strides[i] = stride;
    stride *= dims[i];
  }
  return t;
}

TensorView rng_state_view(const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int32_t device,
                          std::uintptr_t data) {
  const bool integer = (dtype.code == kDLInt || dtype.code == kDLUInt) && dtype.lanes == 1;
  const int64_t words = integer && dtype.bits == 32 ? 4 : integer && dtype.bits == 64 ? 2 : 0;
  if (words == 0 || rank != 1 || dims[0] != words) {
    std::string shape = "(";
    for (int64_t i = 0; i < rank; ++i) shape += (i > 0 ? ", " : "") + std::to_string(dims[i]);
    throw LayoutError(std::string(name) + ": expected the Philox seed and offset as a uint32 (4,) array " +
                      "(jax.random.bits(key, (4,), jnp.uint32)) or an int64 (2,) one, got " + dtype_name(dtype) +
                      " of shape " + shape + (rank == 1 ? ",)" : ")"));
  }
  TensorView t = dense_view(name, 1, {kDLInt, 64, 1}, device, data);  // the same bytes, as the core reads them
  t.dims[0] = 2;
  t.strides[0] = 1;
  return t;
}

TensorView scores_view(const char* name, const int64_t* dims, int64_t rank, int64_t mapped, int64_t batch,
                       DLDataType dtype, int32_t device, std::uintptr_t data) {
  require_rank_at_most_max(name, rank);
  // the caller's own axes: the validator checks their number and extents
  if (mapped <= 0) return slopes_view(name, dims, rank, dtype, device, data);
  const int64_t own = rank - mapped;
  if (own < 1 || own > 4) {
    throw LayoutError(std::string(name) + ": expected 1 to 4 axes broadcastable to (batch, heads of q, seq of q, " +
                      "seq of k) besides jax.vmap's " + std::to_string(mapped) + ", got " + std::to_string(own));
  }
  int64_t calls = 1;  // the mapped axes' extents
  for (int64_t i = 0; i < mapped; ++i) calls *= dims[i];
  int64_t logical[4];
  int8_t caller[4];
  for (int axis = 0; axis < 4; ++axis) {
    const int64_t from = axis - (4 - own);
    logical[axis] = from >= 0 ? dims[mapped + from] : 1;
    caller[axis] = static_cast<int8_t>(from >= 0 ? from : -1);  // the caller's axis numbers, per mapped call
  }
  const int64_t per_call = calls > 0 ? batch / calls : 0;
  if (calls > 1 && logical[0] != per_call) {
    throw LayoutError(std::string(name) + ": under jax.vmap the bias folds into the batch with q, so it needs q's " +
                      "batch axis: give it shape (" + std::to_string(per_call) + ", heads of q or 1, seq of q or 1, " +
                      "seq of k), e.g. jnp.broadcast_to(bias, (" + std::to_string(per_call) + ", " +
                      std::to_string(logical[1]) + ", " + std::to_string(logical[2]) + ", " +
                      std::to_string(logical[3]) + ")); a bias shared across the batch (extent 1 or fewer " +
                      "axes) is not supported under jax.vmap.");
  }
  TensorView t = dense_view(name, 4, dtype, device, data);
  const int64_t strides[4] = {logical[1] * logical[2] * logical[3], logical[2] * logical[3], logical[3], 1};
  for (int axis = 0; axis < 4; ++axis) {
    t.dims[axis] = axis == 0 ? calls * logical[0] : logical[axis];
    t.strides[axis] = strides[axis];
    t.caller_axes[axis] = caller[axis];
  }
  return t;
}

namespace {

using Stream = CUstream_st*;

DLDataType dl_dtype(const char* name, ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F16:
      return {kDLFloat, 16, 1};
    case ffi::DataType::BF16:
      return {kDLBfloat, 16, 1};
    case ffi::DataType::F32:
      return {kDLFloat, 32, 1};
    case ffi::DataType::F64:
      return {kDLFloat, 64, 1};
    case ffi::DataType::S32:
      return {kDLInt, 32, 1};
    case ffi::DataType::S64:
      return {kDLInt, 64, 1};
    case ffi::DataType::U32:
      return {kDLUInt, 32, 1};
    case ffi::DataType::U64:
      return {kDLUInt, 64, 1};
    default:
      throw LayoutError(std::string(name) + ": XLA element type " + std::to_string(static_cast<int>(type)) +
                        " is not float16 or bfloat16");
  }
}

TensorView array_of(const char* name, const ffi::AnyBuffer& buffer, ArrayLayout layout, int32_t device) {
  const auto dims = buffer.dimensions();
  return array_view(name, dims.begin(), static_cast<int64_t>(dims.size()), layout,
                    dl_dtype(name, buffer.element_type()), device,
                    reinterpret_cast<std::uintptr_t>(buffer.untyped_data()));
}

TensorView stats_of(const char* name, const ffi::AnyBuffer& buffer, ArrayLayout layout, int32_t device) {
  const auto dims = buffer.dimensions();
  const auto view = layout == ArrayLayout::thd ? thd_stats_view : stats_view;
  return view(name, dims.begin(), static_cast<int64_t>(dims.size()), dl_dtype(name, buffer.element_type()), device,
              reinterpret_cast<std::uintptr_t>(buffer.untyped_data()));
}

// A bias (or its gradient) buffer as the core's view: q's buffer has 4 axes plus those jax.vmap put
// in front of every operand (vmap_method "broadcast_all"), which the bias folds into q's batch.
TensorView bias_of(const char* name, const ffi::AnyBuffer& buffer, const ffi::AnyBuffer& q, const TensorView& q_view,
                   int32_t device) {
  const auto dims = buffer.dimensions();
  return scores_view(name, dims.begin(), static_cast<int64_t>(dims.size()),
                     static_cast<int64_t>(q.dimensions().size()) - 4, q_view.dims[0],
                     dl_dtype(name, buffer.element_type()), device,
                     reinterpret_cast<std::uintptr_t>(buffer.untyped_data()));
}

// An optional operand's buffer as the core's view, by the kind of its row in the operand table.
// `q` is q's buffer and `q_view` its view (see bias_of).
TensorView optional_view(int slot, const ffi::AnyBuffer& b, const ffi::AnyBuffer& q, const TensorView& q_view,
                         int32_t device) {
  const char* name = kOperands[slot].name;
  const auto dims = b.dimensions();
  const auto rank = static_cast<int64_t>(dims.size());
  const auto data = reinterpret_cast<std::uintptr_t>(b.untyped_data());
  switch (kOperands[slot].kind) {
    case OperandKind::lengths:
    case OperandKind::cumulative:  // (b + 1,) int32: a dense 1-D buffer, read as given
      return lengths_view(name, dims.begin(), rank, dl_dtype(name, b.element_type()), device, data);
    case OperandKind::per_head:  // the slopes keep their own axes under vmap; sinks are shared
      return slot == kAlibiSlopes
                 ? slopes_view(name, dims.begin(), rank, dl_dtype(name, b.element_type()), device, data)
                 : per_head_view(name, dims.begin(), rank, dl_dtype(name, b.element_type()), device, data);
    case OperandKind::scores:
      return bias_of(name, b, q, q_view, device);
    case OperandKind::philox:
      return rng_state_view(name, dims.begin(), rank, dl_dtype(name, b.element_type()), device, data);
    case OperandKind::page_table:
      return block_table_view(name, dims.begin(), rank, dl_dtype(name, b.element_type()), device, data);
    default:
      throw UnsupportedError(std::string(name) + " cannot be passed to stridedfa.jax yet");
  }
}

// The optional trailing arguments and results `present` announces (optional_operands: the operand
// table's order), read into the call's slots.
void read_optional(const ffi::RemainingArgs& rest, const ffi::RemainingRets* more, int64_t present,
                   const ffi::AnyBuffer& q, int32_t device, CallOperands& call) {
  const OptionalOperands given = optional_operands(present, call.op);
  if (static_cast<int>(rest.size()) != given.num_arguments) {
    throw LayoutError("optional_operands " + std::to_string(present) + " announces " +
                      std::to_string(given.num_arguments) + " trailing arguments, got " + std::to_string(rest.size()));
  }
  const int results = more ? static_cast<int>(more->size()) : 0;
  if (results != given.num_results) {
    throw LayoutError("optional_operands " + std::to_string(present) + " announces " +
                      std::to_string(given.num_results) + " trailing results (grad_sinks, grad_bias), got " +
                      std::to_string(results));
  }
  for (int i = 0; i < given.num_arguments; ++i) {
    const int slot = given.arguments[i];
    const auto b = rest.get<ffi::AnyBuffer>(i);
    if (b.has_error()) throw LayoutError(std::string(kOperands[slot].name) + ": not an array");
    call.slot[slot] = optional_view(slot, *b, q, call.slot[kQ], device);
  }
  for (int i = 0; i < given.num_results; ++i) {
    const int slot = given.results[i];
    auto result = more->get<ffi::AnyBuffer>(i);
    if (result.has_error()) throw LayoutError(std::string(kOperands[slot].name) + ": not an array");
    call.slot[slot] = optional_view(slot, **result, q, call.slot[kQ], device);
  }
}

// cuDNN's workspace comes from XLA's allocator; it is released when the handler returns, which is
// safe because XLA orders any reuse of that memory behind this call's work on the same stream.
// XLA refuses alignments above its allocator's (64 bytes; its blocks are 256-byte aligned anyway,
// and cuDNN needs 16). Should XLA still have none to give, execute() takes the workspace from the
// core's own stream-ordered pool (on XLA's stream) instead of failing.
void launch(const PreparedCall& call, Stream stream, ffi::ScratchAllocator& scratch) {
  void* workspace = nullptr;
  if (call.workspace_bytes > 0 && !call.problem.nothing_to_do) {
    const auto allocated = scratch.Allocate(static_cast<size_t>(call.workspace_bytes), 64);
    if (allocated.has_value()) workspace = *allocated;
  }
  execute(call, reinterpret_cast<std::uintptr_t>(stream), workspace);
}

// The core's exception in flight as an XLA error; the message starts with the stridedfa error kind.
ffi::Error current_error() noexcept {
  std::string message;
  try {
    switch (classify_current_exception(message)) {
      case ErrorKind::layout:
        return ffi::Error(ffi::ErrorCode::kInvalidArgument, "stridedfa LayoutError: " + message);
      case ErrorKind::bounds:  // a length outside its buffer, found by the bounds check (a LayoutError)
        return ffi::Error(ffi::ErrorCode::kInvalidArgument, "stridedfa BoundsError: " + message);
      case ErrorKind::unsupported:
        return ffi::Error(ffi::ErrorCode::kUnimplemented, "stridedfa UnsupportedError: " + message);
      case ErrorKind::backend:
        return ffi::Error(ffi::ErrorCode::kInternal, "stridedfa BackendError: " + message);
      default:
        return ffi::Error(ffi::ErrorCode::kInternal, "stridedfa internal error: " + message);
    }
  } catch (...) {  // building the message itself failed (out of memory)
    return ffi::Error::Internal("stridedfa: error while reporting an error");
  }
}

ffi::Error forward(Stream stream, int32_t device, ffi::ScratchAllocator& scratch, const ffi::AnyBuffer& q,
                   const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::RemainingArgs& rest,
                   ffi::AnyBuffer& out, const ffi::AnyBuffer* lse, const SdpaOptions& options, int64_t array_layout,
                   int64_t optional_operands) noexcept {
  try {
    const auto layout = static_cast<ArrayLayout>(array_layout);
    CallOperands call;
    call.slot[kQ] = array_of("q", q, layout, device);
    call.slot[kK] = array_of("k", k, layout, device);
    call.slot[kV] = array_of("v", v, layout, device);
    call.slot[kO] = array_of("out", out, layout, device);
    if (lse) call.slot[kLse] = stats_of("lse", *lse, layout, device);
    read_optional(rest, nullptr, optional_operands, q, device, call);
    launch(prepare_call(call, options), stream, scratch);
    return ffi::Error::Success();
  } catch (...) {
    return current_error();
  }
}

ffi::Error forward_impl(Stream stream, int32_t device, ffi::ScratchAllocator scratch, ffi::AnyBuffer q,
                        ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> lse, SdpaOptions options, int64_t layout,
                        int64_t optional_operands) {
  return forward(stream, device, scratch, q, k, v, rest, *out, &*lse, options, layout, optional_operands);
}

ffi::Error forward_inference_impl(Stream stream, int32_t device, ffi::ScratchAllocator scratch, ffi::AnyBuffer q,
                                  ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs rest,
                                  ffi::Result<ffi::AnyBuffer> out, SdpaOptions options, int64_t layout,
                                  int64_t optional_operands) {
  return forward(stream, device, scratch, q, k, v, rest, *out, nullptr, options, layout, optional_operands);
}

ffi::Error backward_impl(Stream stream, int32_t device, ffi::ScratchAllocator scratch, ffi::AnyBuffer q,
                         ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                         ffi::AnyBuffer grad_out, ffi::RemainingArgs rest, ffi::Result<ffi::AnyBuffer> grad_q,
                         ffi::Result<ffi::AnyBuffer> grad_k, ffi::Result<ffi::AnyBuffer> grad_v,
                         ffi::RemainingRets more, SdpaOptions options, int64_t layout, int64_t optional_operands) {
  try {
    const auto array_layout = static_cast<ArrayLayout>(layout);
    CallOperands call;
    call.op = GraphOp::backward;
    call.slot[kQ] = array_of("q", q, array_layout, device);
    call.slot[kK] = array_of("k", k, array_layout, device);
    call.slot[kV] = array_of("v", v, array_layout, device);
    call.slot[kO] = array_of("out", out, array_layout, device);
    call.slot[kLse] = stats_of("lse", lse, array_layout, device);
    call.slot[kGradO] = array_of("grad_out", grad_out, array_layout, device);
    call.slot[kGradQ] = array_of("grad_q", *grad_q, array_layout, device);
    call.slot[kGradK] = array_of("grad_k", *grad_k, array_layout, device);
    call.slot[kGradV] = array_of("grad_v", *grad_v, array_layout, device);
    read_optional(rest, &more, optional_operands, q, device, call);
    launch(prepare_call(call, options), stream, scratch);
    return ffi::Error::Success();
  } catch (...) {
    return current_error();
  }
}

// The attributes every handler takes, in the order of the *_impl parameters: the call's options
// (a dictionary, see AttrDecoding<SdpaOptions> above), the arrays' layout and the optional operands given.
template <typename Binding>
auto with_attrs(Binding binding) {
  return std::move(binding)
      .template Attr<SdpaOptions>("options")
      .template Attr<int64_t>("layout")
      .template Attr<int64_t>("optional_operands");
}

// The execution context every handler takes: XLA's stream, the device ordinal, its scratch memory.
auto bind_context() {
  return ffi::Ffi::Bind().Ctx<ffi::PlatformStream<Stream>>().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::ScratchAllocator>();
}

}  // namespace
}  // namespace stridedfa::jax_ffi

// Not command-buffer compatible (no ffi::Traits): a call may build a graph or allocate workspace.
XLA_FFI_DEFINE_HANDLER_SYMBOL(stridedfa_jax_sdpa_forward, stridedfa::jax_ffi::forward_impl,
                              stridedfa::jax_ffi::with_attrs(stridedfa::jax_ffi::bind_context()
                                                                 .Arg<ffi::AnyBuffer>()     // q
                                                                 .Arg<ffi::AnyBuffer>()     // k
                                                                 .Arg<ffi::AnyBuffer>()     // v
                                                                 .RemainingArgs()           // optional operands
                                                                 .Ret<ffi::AnyBuffer>()     // out
                                                                 .Ret<ffi::AnyBuffer>()));  // lse

XLA_FFI_DEFINE_HANDLER_SYMBOL(stridedfa_jax_sdpa_forward_inference, stridedfa::jax_ffi::forward_inference_impl,
                              stridedfa::jax_ffi::with_attrs(stridedfa::jax_ffi::bind_context()
                                                                 .Arg<ffi::AnyBuffer>()     // q
                                                                 .Arg<ffi::AnyBuffer>()     // k
                                                                 .Arg<ffi::AnyBuffer>()     // v
                                                                 .RemainingArgs()           // optional operands
                                                                 .Ret<ffi::AnyBuffer>()));  // out

XLA_FFI_DEFINE_HANDLER_SYMBOL(stridedfa_jax_sdpa_backward, stridedfa::jax_ffi::backward_impl,
                              stridedfa::jax_ffi::with_attrs(stridedfa::jax_ffi::bind_context()
                                                                 .Arg<ffi::AnyBuffer>()  // q
                                                                 .Arg<ffi::AnyBuffer>()  // k
                                                                 .Arg<ffi::AnyBuffer>()  // v
                                                                 .Arg<ffi::AnyBuffer>()  // out
                                                                 .Arg<ffi::AnyBuffer>()  // lse
                                                                 .Arg<ffi::AnyBuffer>()  // grad_out
                                                                 .RemainingArgs()        // optional operands
                                                                 .Ret<ffi::AnyBuffer>()  // grad_q
                                                                 .Ret<ffi::AnyBuffer>()  // grad_k
                                                                 .Ret<ffi::AnyBuffer>()  // grad_v
                                                                 .RemainingRets()));     // grad_sinks, grad_bias

namespace stridedfa::jax_ffi {

void* forward_handler() { return reinterpret_cast<void*>(&stridedfa_jax_sdpa_forward); }
void* forward_inference_handler() { return reinterpret_cast<void*>(&stridedfa_jax_sdpa_forward_inference); }
void* backward_handler() { return reinterpret_cast<void*>(&stridedfa_jax_sdpa_backward); }

}  // namespace stridedfa::jax_ffi
