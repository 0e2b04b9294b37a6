#include "stridedfa/visibility.hpp"

#include <algorithm>

namespace stridedfa {

Visibility visible_region(const SdpaOptions& options, const Problem& p, bool has_lengths) {
  Visibility v{0, p.s_q, 0, p.s_kv};
  if (has_lengths) return v;
  const int64_t left = options.left_bound(), right = options.right_bound();
  const int64_t unbounded = SdpaOptions::kUnbounded;
  // Query i sees key j iff i + off - left <= j <= i + off + right, 0 <= j < s_kv.
  if (options.alignment == CausalAlignment::bottom_right) {
    const int64_t off = p.s_kv - p.s_q;
    // Leading rows see no key when i + off + right < 0; leading keys are seen by no row when
    // j < row_begin + off - left (below the first kept row's window). The last row's diagonal is the last key,
    // so nothing trails. Cutting r rows and c keys off the front keeps the bottom-right offset
    // (s_kv - c) - (s_q - r) = off - c + r exact for the sub-problem.
    if (right != unbounded) v.row_begin = std::clamp<int64_t>(-(off + right), 0, p.s_q);
    if (left != unbounded) v.key_begin = std::clamp<int64_t>(v.row_begin + off - left, 0, p.s_kv);
  } else {
    // Trailing rows see no key when i - left > s_kv - 1; trailing keys are seen by no row when
    // j > (row_end - 1) + right.
    if (left != unbounded) v.row_end = std::clamp<int64_t>(p.s_kv + left, 0, p.s_q);
    if (right != unbounded) v.key_end = std::clamp<int64_t>(v.row_end + right, 0, p.s_kv);
  }
  return v;
}

TensorView axis_slice(const TensorView& t, int axis, int64_t begin, int64_t end) {
  TensorView s = t;
  s.data = t.data + static_cast<std::uintptr_t>(begin * t.strides[axis] * t.itemsize());
  s.dims[axis] = end - begin;
  return s;
}

TensorView seq_slice(const TensorView& t, int64_t begin, int64_t end) { return axis_slice(t, 2, begin, end); }

}  // namespace stridedfa
