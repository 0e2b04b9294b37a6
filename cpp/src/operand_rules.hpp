// The rules each operand must satisfy on its own -- axes, device, dtype, memory (alignment, signs,
// reach), shapes of the auxiliary operands (lengths, per-head values, a bias, a page table,
// cu_seqlens, THD tokens and statistics) -- as the Validator that validate.cpp walks over the
// operand table, with the text helpers every message uses. Private to the validator (included by
// validate.cpp only).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "stridedfa/errors.hpp"
#include "stridedfa/cudnn_quirks.hpp"
#include "stridedfa/overlap.hpp"
#include "stridedfa/validate.hpp"
#include "stridedfa/validate_ragged.hpp"

namespace stridedfa {
namespace operand_rules {

inline constexpr int64_t kAlignment = 16;  // bytes
inline constexpr const char* kAxisNames[4] = {"batch", "heads", "seq", "head_dim"};

inline std::string shape_str(const TensorView& t) {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < t.ndim; ++i) s << (i ? ", " : "") << t.dims[i];
  s << (t.ndim == 1 ? ",)" : ")");
  return s.str();
}

// "axis 2 (heads)": the caller's number for the axis (TensorView::caller_axes), the core's name.
inline std::string axis_str(const TensorView& t, int axis) {
  return "axis " + std::to_string(t.caller_axes[axis]) + " (" + (axis < 4 ? kAxisNames[axis] : "?") + ")";
}

// The same for a score bias: (batch, heads, seq of q, seq of k); "a missing axis" where the caller
// gave fewer axes.
inline std::string scores_axis_str(const TensorView& t, int axis) {
  static const char* const names[4] = {"batch", "heads", "seq of q", "seq of k"};
  if (t.caller_axes[axis] < 0) return std::string("a missing axis (") + names[axis] + ")";
  return "axis " + std::to_string(t.caller_axes[axis]) + " (" + names[axis] + ")";
}

inline bool is_half(DLDataType d) {
  return d.lanes == 1 && d.bits == 16 && (d.code == kDLFloat || d.code == kDLBfloat);
}
inline bool is_float32(DLDataType d) { return d.lanes == 1 && d.bits == 32 && d.code == kDLFloat; }
inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

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

  // FP8 attention's scales, descales and amax outputs: reserved rows of the operand table until FP8
  // attention lands (issue 34) and gives them their graph lines.
  void fp8_scale(const TensorView& t) {
    throw UnsupportedError(std::string(t.name) +
                           " is an FP8 attention operand; FP8 attention is not supported yet. Pass float16 or "
                           "bfloat16 q, k and v and leave the FP8 scales, descales and amax outputs out.");
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
      if (bias && quirk_applies(Quirk::bias_grad_shared_rows)) {
        const std::string s_q = std::to_string(full[0]), s_kv = std::to_string(full[1]);
        throw UnsupportedError(
            "grad_bias: the gradient of a bias shared over query rows (" + scores_axis_str(shape_of, axis) +
            " of extent 1) is not supported: cuDNN 9.19 computes it wrongly and writes past it. "
            "Give the bias a row per query -- a broadcast is enough, and the framework sums the "
            "gradient back: bias.expand(-1, -1, " +
            s_q + ", -1) in torch, jnp.broadcast_to(bias, (b, h, " + s_q + ", " + s_kv +
            ")) in JAX -- or leave its gradient out (a constant mask)." + quirk_tag(Quirk::bias_grad_shared_rows));
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
        if (t.ndim == 4 && stride == t.dims[3]) {  // what a dense tensor (every JAX array) with such a head_dim has
          s << " In a dense tensor that stride is head_dim (" << t.dims[3] << "), which must then be a multiple of "
            << kAlignment / item << ": pad it with zeros (padded q and k leave the scores unchanged; slice the "
            << "output of a padded v back).";
        }
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

}  // namespace operand_rules
}  // namespace stridedfa
