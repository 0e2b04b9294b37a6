// Which query rows and keys of a call see anything under its mask, and what is written where
// nothing is seen. cuDNN refuses (or computes garbage for) query rows that see no key -- causal
// bottom-right with s_q > s_kv, or a window that leaves rows empty -- so the core describes only
// the rows and keys that take part (views into the caller's tensors, no copy) and fills the rest
// with the documented values: out = 0, lse = -inf, zero gradients (FlashAttention's definition).
#pragma once

#include <cstdint>

#include "stridedfa/sdpa_types.hpp"
#include "stridedfa/tensor_view.hpp"

namespace stridedfa {

// Query rows [row_begin, row_end) and keys [key_begin, key_end) take part; the alignment of the
// mask is unchanged by the restriction (the offset it implies still holds for the sub-problem).
struct Visibility {
  int64_t row_begin = 0, row_end = 0, key_begin = 0, key_end = 0;
  bool restricts(const Problem& p) const {
    return row_begin != 0 || row_end != p.s_q || key_begin != 0 || key_end != p.s_kv;
  }
  bool empty() const { return row_end <= row_begin || key_end <= key_begin; }
};

// From the static extents alone. With padding lengths the rows each sequence sees are decided on
// the device, so nothing is restricted here (the caller passes has_lengths).
Visibility visible_region(const SdpaOptions& options, const Problem& p, bool has_lengths);

// t restricted to [begin, end) of one axis: a view, no copy. seq_slice: of its seq axis (axis 2).
TensorView axis_slice(const TensorView& t, int axis, int64_t begin, int64_t end);
TensorView seq_slice(const TensorView& t, int64_t begin, int64_t end);

// A region of an output the graph does not write, with the 32-bit pattern it gets (zero for
// float16/bfloat16 data, -inf for the float32 statistics).
struct Fill {
  TensorView region;
  uint32_t pattern = 0;
};

// An output the graph does not write that equals an input (same dims and dtype).
struct Copy {
  TensorView from, to;
};

inline constexpr uint32_t kNegativeInfinityBits = 0xff800000u;
inline constexpr int kMaxCopies = 1;
// At most 8: a region before and after the kept rows of each output with a seq axis (out and lse,
// or dQ, dK and dV) and the bias' gradient whole, or the few whole-output fills of padding, s = 1
// and empty-batch calls.
inline constexpr int kMaxFills = 8;

}  // namespace stridedfa
