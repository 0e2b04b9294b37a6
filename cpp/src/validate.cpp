// The validator: every rule a call must satisfy before anything is built or launched. Each failure
// names the tensor, the axis, the offending value and the fix. Rules and why they exist:
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
#include "stridedfa/overlap.hpp"
#include "stridedfa/sdpa.hpp"
#include "stridedfa/validate_ragged.hpp"

namespace stridedfa {
namespace {

constexpr int64_t kAlignment = 16;  // bytes
const char* const kAxisNames[4] = {"batch", "heads", "seq", "head_dim"};

std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << t.dims[i];
  s << (t.ndim == 1 ? ",)" : ")");
  return s.str();
}

// "axis 2 (heads)": the caller's number for the axis (TensorView::caller_axes), the core's name.
std::string axis_str(const TensorView& t, int axis) {
  return "axis " + std::to_string(t.caller_axes[axis]) + " (" + (axis < 4 ? kAxisNames[axis] : "?") + ")";
}

// The same for a score bias: (batch, heads, seq of q, seq of k); "a missing axis" where the caller
// gave fewer axes.
std::string scores_axis_str(const TensorView& t, int axis) {
  static const char* const names[4] = {"batch", "heads", "seq of q", "seq of k"};
  if (t.caller_axes[axis] < 0) return std::string("a missing axis (") + names[axis] + ")";
  return "axis " + std::to_string(t.caller_axes[axis]) + " (" + names[axis] + ")";
}

bool is_half(DLDataType d) { return d.lanes == 1 && d.bits == 16 && (d.code == kDLFloat || d.code == kDLBfloat); }
bool is_float32(DLDataType d) { return d.lanes == 1 && d.bits == 32 && d.code == kDLFloat; }
bool same_dtype(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

class Validator {
 public:
  // Basic per-tensor rules: 4 axes, CUDA, dtype class.
  void operand(const TensorView& t) {
    if (t.ndim != 4) {
      throw LayoutError(std::string(t.name) + ": expected 4 axes (batch, heads, seq, head_dim), got " +
                        std::to_string(t.ndim) + " with shape " + shape_str(t) +
                        ". Give the logical (b, h, s, d) view; a bshd tensor is x.transpose(1, 2).");
    }
    check_addressable(t);
    device(t);
    if (!is_half(t.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; attention operands must be float16 or bfloat16.");
    }
  }

  // A variable-length call's attention operand: (tokens, heads, head_dim).
  void thd_operand(const TensorView& t) {
    if (t.ndim != 3) {
      throw LayoutError(std::string(t.name) + ": with cu_seqlens (a variable-length call) expected 3 axes (tokens, " +
                        "heads, head_dim), got " + std::to_string(t.ndim) + " with shape " + shape_str(t) +
                        ". Sequences are packed along the token axis; cu_seqlens says where each starts.");
    }
    check_addressable(t);
    device(t);
    if (!is_half(t.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; attention operands must be float16 or bfloat16.");
    }
  }

  // A variable-length call's statistics: float32 (heads of q, tokens of q), any strides.
  void thd_stats(const TensorView& t) {
    if (t.ndim != 2) {
      throw LayoutError(std::string(t.name) + ": with cu_seqlens expected shape (heads of q, tokens of q), got " +
                        shape_str(t) + " (a (tokens, heads) buffer is passed as its transpose, x.T).");
    }
    check_addressable(t);
    device(t);
    if (!is_float32(t.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; the softmax statistics (log-sum-exp) are float32.");
    }
  }

  // A paged cache's block table: int32 (batch, blocks per sequence), each row contiguous.
  void page_table(const TensorView& t) {
    if (t.ndim != 2) {
      throw LayoutError(std::string(t.name) + ": expected shape (batch, blocks per sequence), got " + shape_str(t) +
                        ".");
    }
    check_addressable(t);
    device(t);
    if (!(t.dtype.code == kDLInt && t.dtype.bits == 32 && t.dtype.lanes == 1)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; block ids are int32 (torch: x.int()).");
    }
    const bool rows_ok = t.dims[1] <= 1 || t.strides[1] == 1;
    const bool apart_ok = t.dims[0] <= 1 || t.strides[0] >= t.dims[1];
    if (!rows_ok || !apart_ok) {
      throw LayoutError(std::string(t.name) + ": strides " + strides_str(t) +
                        "; each sequence's row of block ids must be contiguous (x.contiguous()).");
    }
    if (t.numel() != 0 && t.data % 4 != 0) {
      throw LayoutError(std::string(t.name) + ": data pointer is not 4-byte aligned; pass a contiguous copy.");
    }
    if (t.numel() != 0 && (element_extent(t) > INT32_MAX || t.numel() > INT32_MAX)) {
      throw UnsupportedError(std::string(t.name) + ": more than 2^31 block ids; split the batch over calls.");
    }
  }

  // Cumulative sequence starts: int32 (batch + 1,), 0 first, each sequence's end after it.
  void cumulative(const TensorView& t) {
    vector(t, t.ndim == 1 && t.dims[0] >= 1, "(batch + 1,) of cumulative sequence starts (0, end of sequence 0, ...)",
           t.dtype.code == kDLInt && t.dtype.bits == 32 && t.dtype.lanes == 1,
           "cu_seqlens are int32 (torch: x.int(); FlashAttention's cu_seqlens are int32 too)");
  }

  void stats(const TensorView& t) {
    bool shape_ok = t.ndim == 3 || (t.ndim == 4 && t.dims[3] == 1);
    if (!shape_ok) {
      throw LayoutError(std::string(t.name) +
                        ": expected shape (batch, heads of q, seq of q) or with a trailing axis of 1, got " +
                        shape_str(t) + ".");
    }
    check_addressable(t);
    device(t);
    if (!is_float32(t.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; the softmax statistics (log-sum-exp) are float32.");
    }
  }

  // Padding lengths: int32 (batch,) or (batch, 1, 1, 1), read by cuDNN on the device only.
  void lengths(const TensorView& t) {
    const bool shape_ok = t.ndim == 1 || (t.ndim == 4 && t.dims[1] == 1 && t.dims[2] == 1 && t.dims[3] == 1);
    const bool int32 = t.dtype.code == kDLInt && t.dtype.bits == 32 && t.dtype.lanes == 1;
    vector(t, shape_ok, "(batch,) of per-sequence lengths", int32, "sequence lengths are int32 (torch: x.int())");
  }

  // Per-head values (attention sinks and their gradient, ALiBi slopes): float32 (h_q,).
  void per_head(const TensorView& t) {
    vector(t, t.ndim == 1, "(heads of q,), one value per query head", is_float32(t.dtype),
           "per-head values (attention sinks, ALiBi slopes) are float32 (torch: x.float())");
  }

  // Dropout's Philox seed and offset: int64 (2,) on the device, read by cuDNN as two scalars (so
  // any stride), never on the host (CUDA graphs replay with the values of the moment).
  void philox(const TensorView& t) {
    if (t.ndim != 1 || t.dims[0] != 2) {
      throw LayoutError(std::string(t.name) + ": expected shape (2,) holding the Philox seed and offset, got " +
                        shape_str(t) + ".");
    }
    check_addressable(t);
    device(t);
    if (!(t.dtype.code == kDLInt && t.dtype.bits == 64 && t.dtype.lanes == 1)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; the Philox seed and offset are int64 (torch: x.long()).");
    }
    if (t.data % 8 != 0) {
      throw LayoutError(std::string(t.name) + ": data pointer is not 8-byte aligned; pass a contiguous copy.");
    }
  }

  // An additive score bias or its gradient: up to 4 axes (fewer are leading axes of 1).
  void scores(const TensorView& t) {
    if (t.ndim < 1 || t.ndim > 4) {
      throw LayoutError(std::string(t.name) + ": expected up to 4 axes broadcastable to (batch, heads of q, " +
                        "seq of q, seq of k), got " + std::to_string(t.ndim) + " with shape " + shape_str(t) + ".");
    }
    check_addressable(t);
    device(t);
    if (!is_half(t.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) +
                        " is not supported; a score bias has the attention dtype (float16 or bfloat16; torch: " +
                        "x.to(q.dtype); a boolean mask m becomes torch.where(m, 0, -inf)).");
    }
  }

  // bias: each axis is the problem's extent or 1 (shared); grad_bias: exactly bias' shape.
  void scores_shape(const TensorView& t, const int64_t (&expected)[4], const TensorView* bias) {
    for (int axis = 0; axis < 4; ++axis) {
      const int64_t want = bias ? bias->dims[axis] : expected[axis];
      if (t.dims[axis] == want || (!bias && t.dims[axis] == 1)) continue;
      std::ostringstream s;
      s << t.name << ": shape " << shape_str(t) << " is not "
        << (bias ? "bias' shape " + shape_str(*bias)
                 : "broadcastable to (batch, heads of q, seq of q, seq of k) = (" + std::to_string(expected[0]) + ", " +
                       std::to_string(expected[1]) + ", " + std::to_string(expected[2]) + ", " +
                       std::to_string(expected[3]) + ")")
        << "; " << scores_axis_str(t, axis) << " is " << t.dims[axis] << ", expected " << want << (bias ? "" : " or 1")
        << ".";
      throw LayoutError(s.str());
    }
  }

  // The bias is read with its key axis contiguous and a column per key; batch, heads and rows may
  // be shared (stride 0), but its gradient is computed only for a bias with a row per query.
  // `full` is (s_q, s_kv); `bias` is the bias when t is its gradient.
  void scores_memory(const TensorView& t, bool is_output, const int64_t (&full)[2], const TensorView* bias) {
    if (t.numel() == 0) return;
    const TensorView& shape_of = bias ? *bias : t;
    for (int axis = 3; axis >= 2; --axis) {
      const bool shared = shape_of.dims[axis] != full[axis - 2] || (!bias && t.strides[axis] == 0);
      if (full[axis - 2] <= 1 || !shared) continue;
      if (axis == 3) {
        throw UnsupportedError(std::string(shape_of.name) + ": " + scores_axis_str(shape_of, axis) +
                               " is shared; cuDNN reads a bias only with a column for every key (a bias constant "
                               "along a row changes no probability: leave it out).");
      }
      if (bias) {
        throw UnsupportedError("grad_bias: the gradient of a bias shared over query rows (" +
                               scores_axis_str(shape_of, axis) +
                               " of extent 1) is not supported: cuDNN 9.19 computes it wrongly and writes past it. "
                               "Give the bias a row per query (bias.expand(-1, -1, s_q, -1).contiguous()) to get "
                               "its gradient, or leave grad_bias out (a constant mask).");
      }
    }
    for (int axis = 0; axis < 4; ++axis) {
      const int64_t extent = t.dims[axis], stride = t.strides[axis];
      if (extent == 1) continue;
      if (stride < 0) {
        throw LayoutError(std::string(t.name) + ": " + scores_axis_str(t, axis) + " has negative stride " +
                          std::to_string(stride) + "; cuDNN cannot walk memory backwards. Pass a copy " +
                          "(torch: x.contiguous(), CuPy: cupy.ascontiguousarray(x)).");
      }
      if (stride == 0 && is_output) {
        throw LayoutError(std::string(t.name) + ": " + scores_axis_str(t, axis) + " has stride 0 (a broadcast view); " +
                          "an output needs its own memory for every element.");
      }
      if (axis == 3 && stride != 1) {
        throw LayoutError(std::string(t.name) + ": " + scores_axis_str(t, axis) + " has stride " +
                          std::to_string(stride) + "; cuDNN reads a bias with its key axis contiguous (stride 1). " +
                          "Pass a copy (x.contiguous()).");
      }
    }
    if (t.data % kAlignment != 0) {
      std::ostringstream s;
      s << t.name << ": data pointer 0x" << std::hex << t.data << std::dec << " is " << t.data % kAlignment
        << " bytes past a " << kAlignment << "-byte boundary; cuDNN reads a bias with 16-byte loads (a misaligned "
        << "one faults the GPU). Pass a copy (x.contiguous()) or slice at a multiple of 8 elements.";
      throw LayoutError(s.str());
    }
  }

  // A small 4-byte vector read by cuDNN as dense: its shape, dtype, contiguity and alignment.
  void vector(const TensorView& t, bool shape_ok, const char* shape, bool dtype_ok, const char* dtype) {
    if (!shape_ok) {
      throw LayoutError(std::string(t.name) + ": expected shape " + shape + ", got " + shape_str(t) + ".");
    }
    check_addressable(t);
    device(t);
    if (!dtype_ok) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) + " is not supported; " + dtype + ".");
    }
    if (t.dims[0] > 1 && t.strides[0] != 1) {
      throw LayoutError(std::string(t.name) + ": axis 0 has stride " + std::to_string(t.strides[0]) +
                        "; pass a contiguous vector (x.contiguous()).");
    }
    if (t.numel() != 0 && t.data % 4 != 0) {
      throw LayoutError(std::string(t.name) + ": data pointer is not 4-byte aligned; pass a contiguous copy.");
    }
  }

  void device(const TensorView& t) {
    if (t.device_type != kDLCUDA) {
      throw LayoutError(
          std::string(t.name) + " needs a CUDA device; it lives in " + device_type_name(t.device_type) +
          ". Move it to the GPU first (torch: x.cuda(), CuPy: cupy.asarray(x), JAX: jax.device_put(x, gpu)).");
    }
    if (t.device_id < 0) {
      throw LayoutError(std::string(t.name) + ": its producer reports CUDA device " + std::to_string(t.device_id) +
                        "; device ordinals are 0 or more (a malformed DLPack tensor).");
    }
  }

  void same_device_and_dtype(const TensorView& ref, const TensorView& t, bool check_dtype) {
    if (t.device_id != ref.device_id) {
      throw LayoutError(std::string(t.name) + " is on cuda:" + std::to_string(t.device_id) + " but " + ref.name +
                        " is on cuda:" + std::to_string(ref.device_id) +
                        "; all tensors of a call must be on one device.");
    }
    if (check_dtype && !same_dtype(t.dtype, ref.dtype)) {
      throw LayoutError(std::string(t.name) + ": dtype " + dtype_name(t.dtype) + " differs from " + ref.name + "'s " +
                        dtype_name(ref.dtype) + "; all attention operands of a call share one dtype.");
    }
  }

  void shape(const TensorView& t, const int64_t (&expected)[4], const char* meaning) {
    for (int axis = 0; axis < 4; ++axis) {
      if (t.dims[axis] != expected[axis]) {
        std::ostringstream s;
        s << t.name << ": shape " << shape_str(t) << " does not match " << meaning << " = (" << expected[0] << ", "
          << expected[1] << ", " << expected[2] << ", " << expected[3] << "); " << axis_str(t, axis) << " is "
          << t.dims[axis] << ", expected " << expected[axis] << ".";
        throw LayoutError(s.str());
      }
    }
  }

  // Stride and pointer rules for a non-empty tensor.
  void memory(const TensorView& t, bool is_output, bool is_stats) {
    if (t.numel() == 0) return;
    const int64_t item = t.itemsize();
    for (int axis = 0; axis < t.ndim; ++axis) {
      const int64_t extent = t.dims[axis], stride = t.strides[axis];
      if (extent == 1) continue;  // never stepped along: any stride is fine
      if (stride < 0) {
        throw LayoutError(std::string(t.name) + ": " + axis_str(t, axis) + " has negative stride " +
                          std::to_string(stride) +
                          "; cuDNN cannot walk memory backwards. Pass a copy (torch: x.contiguous(), CuPy: " +
                          "cupy.ascontiguousarray(x)).");
      }
      if (stride == 0) {
        if (is_output) {
          throw LayoutError(std::string(t.name) + ": " + axis_str(t, axis) +
                            " has stride 0 (a broadcast view); an output needs " +
                            "its own memory for every element. Allocate it with torch.empty / cupy.empty.");
        }
        throw LayoutError(
            std::string(t.name) + ": " + axis_str(t, axis) + " has stride 0 (a broadcast view), which cuDNN " +
            "cannot read. Materialise it (x.contiguous()); for GQA pass k and v with their own h_kv heads, " +
            "stridedfa maps query heads onto them itself.");
      }
      if (!is_stats && axis == 3) {
        if (stride != 1) {
          throw LayoutError(std::string(t.name) + ": " + axis_str(t, axis) + " has stride " + std::to_string(stride) +
                            "; cuDNN needs the head_dim axis contiguous (stride 1). Pass a view whose last logical " +
                            "axis is contiguous in memory, or a copy (x.contiguous()).");
        }
        continue;
      }
      if (!is_stats && (stride * item) % kAlignment != 0) {
        std::ostringstream s;
        s << t.name << ": " << axis_str(t, axis) << " has stride " << stride << " elements = " << stride * item
          << " bytes, not a multiple of " << kAlignment << " bytes; cuDNN's vector loads would read misaligned "
          << "data (wrong results on Hopper). Pad that axis to a multiple of " << kAlignment / item
          << " elements or pass a contiguous copy.";
        throw LayoutError(s.str());
      }
    }
    if (t.data % kAlignment != 0) {
      std::ostringstream s;
      s << t.name << ": data pointer 0x" << std::hex << t.data << std::dec << " is " << t.data % kAlignment
        << " bytes past a " << kAlignment << "-byte boundary; cuDNN needs every operand " << kAlignment
        << "-byte aligned. This happens with a slice that starts mid-row (e.g. x[..., 1:]); pass a copy or "
        << "re-slice at an aligned offset.";
      throw LayoutError(s.str());
    }
  }

  void writable(const TensorView& t) {
    if (t.read_only) {
      throw LayoutError(std::string(t.name) + " is read-only (its producer marked it so, or it is an immutable " +
                        "JAX array); outputs are written in place, so pass a writable array.");
    }
    switch (internal_overlap(t)) {
      case Overlap::none:
        return;
      case Overlap::overlaps:
        throw LayoutError(std::string(t.name) + ": two of its elements share memory (strides " + strides_str(t) +
                          " for shape " + shape_str(t) + "); an output needs distinct memory for every element.");
      case Overlap::unknown:
        throw LayoutError(std::string(t.name) + ": stridedfa could not prove that its elements do not share memory " +
                          "(strides " + strides_str(t) + " are too irregular to decide quickly); pass a dense output.");
    }
  }

  void disjoint(const TensorView& out, const TensorView& other) {
    if (!other.present) return;
    switch (memory_overlap(out, other)) {
      case Overlap::none:
        return;
      case Overlap::overlaps:
        throw LayoutError(
            std::string(out.name) + " overlaps " + other.name + " in memory; outputs are written in place and " +
            "must not share memory with each other or with any input. Give " + out.name + " its own buffer.");
      case Overlap::unknown:
        throw LayoutError(std::string("stridedfa could not prove that ") + out.name + " and " + other.name +
                          " do not overlap (their strides are too irregular to decide quickly); give " + out.name +
                          " its own buffer.");
    }
  }

  static std::string strides_str(const TensorView& t) {
    std::ostringstream s;
    s << "(";
    for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << t.strides[i];
    s << ")";
    return s.str();
  }
};

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

// cuDNN's backward addresses its operands with 32-bit arithmetic (GPU runs 13 and 14, cuDNN 9.19):
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
                         "the batch over several calls if the tensor itself is that large.");
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
  for (int s : {kCuSeqlensQ, kCuSeqlensKV, kBias, kAlibiSlopes, kSinks}) {
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

// Every rule, walking the operand table: per-operand checks, shapes against what q, k and v
// establish, then memory rules, then outputs writable and disjoint from every input and from
// each other. `given[slot]` is null where the op has no such operand.
Problem validate(GraphOp op, const SlotViews& given) {
  Validator check;
  const TensorView* t[kNumSlots] = {};  // the operands present, each as its 4-axis view
  TensorView as4[kNumSlots];
  const bool ragged = is_ragged(given);
  for (int s = 0; s < kNumSlots; ++s) {
    if (role_in(op, s) == Role::absent || !given[s]) continue;
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
    }
    as4[s] = as_4d(*given[s], kOperands[s].kind, ragged);
    t[s] = &as4[s];
  }
  if (ragged) check_ragged_operands(t);
  for (int s = kQ + 1; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (t[s]) check.same_device_and_dtype(*t[kQ], *t[s], kind == OperandKind::attention || kind == OperandKind::scores);
  }

  const bool paged = t[kBlockTable] != nullptr;
  Problem p = problem_from(*t[kQ], *t[kK], *t[kV], paged);  // q, k and v agree with each other
  if (paged) set_paged(p, t);
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
  if (op == GraphOp::backward) {
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

}  // namespace

void validate_options(const SdpaOptions& options, const Problem& p) {
  (void)p;
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

Problem validate_forward(const ForwardArgs& a) { return validate(GraphOp::forward, a.slots()); }

Problem validate_backward(const BackwardArgs& a) { return validate(GraphOp::backward, a.slots()); }

}  // namespace stridedfa
