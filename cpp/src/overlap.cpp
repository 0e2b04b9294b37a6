// Overlap of strided tensors as a bounded integer feasibility problem.
//
// A tensor covers the bytes  base + sum_k stride_k * x_k + [0, width)  for 0 <= x_k < extent_k.
// Two tensors share a byte iff some choice of indices puts their element starts less than a
// width apart:  base_a - base_b + sum_k c_k x_k  lies in  (-width_a, width_b). The search below
// decides "is there an integer point with sum c_k x_k in [lo, hi], l_k <= x_k <= u_k" by fixing
// the largest coefficient first and pruning with the reachable range of the rest and with the gcd
// of the remaining coefficients. For the layouts people use (nested, interleaved, packed) it
// finishes in a handful of steps; a work limit turns pathological cases into Overlap::unknown.
#include "stridedfa/overlap.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

namespace stridedfa {
namespace {

using wide = __int128;

struct Term {
  wide coef;  // > 0 after normalisation
  wide lo, hi;
};

wide floor_div(wide a, wide b) {  // b > 0
  wide q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
wide ceil_div(wide a, wide b) { return -floor_div(-a, b); }

wide gcd_wide(wide a, wide b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b != 0) {
    wide t = a % b;
    a = b;
    b = t;
  }
  return a;
}

class Solver {
 public:
  explicit Solver(std::vector<Term> terms) : terms_(std::move(terms)) {
    // Flip negative coefficients, merge equal ones (c*x + c*y spans c*[lx+ly, ux+uy]).
    for (auto& t : terms_) {
      if (t.coef < 0) {
        t.coef = -t.coef;
        wide lo = -t.hi;
        t.hi = -t.lo;
        t.lo = lo;
      }
    }
    std::sort(terms_.begin(), terms_.end(), [](const Term& a, const Term& b) { return a.coef > b.coef; });
    std::vector<Term> merged;
    for (const auto& t : terms_) {
      if (t.coef == 0) continue;  // contributes nothing
      if (!merged.empty() && merged.back().coef == t.coef) {
        merged.back().lo += t.lo;
        merged.back().hi += t.hi;
      } else {
        merged.push_back(t);
      }
    }
    terms_ = std::move(merged);
    const size_t n = terms_.size();
    suffix_min_.assign(n + 1, 0);
    suffix_max_.assign(n + 1, 0);
    suffix_gcd_.assign(n + 1, 0);
    for (size_t i = n; i-- > 0;) {
      suffix_min_[i] = suffix_min_[i + 1] + terms_[i].coef * terms_[i].lo;
      suffix_max_[i] = suffix_max_[i + 1] + terms_[i].coef * terms_[i].hi;
      suffix_gcd_[i] = gcd_wide(suffix_gcd_[i + 1], terms_[i].coef);
    }
  }

  // Is there a point with sum coef*x in [lo, hi]?
  Overlap feasible(wide lo, wide hi) {
    work_ = 0;
    gave_up_ = false;
    bool found = search(0, lo, hi);
    if (found) return Overlap::overlaps;
    return gave_up_ ? Overlap::unknown : Overlap::none;
  }

 private:
  static constexpr long kWorkLimit = 2'000'000;

  bool search(size_t i, wide lo, wide hi) {
    if (lo > hi) return false;
    if (hi < suffix_min_[i] || lo > suffix_max_[i]) return false;
    const wide g = suffix_gcd_[i];
    if (g > 1 && floor_div(hi, g) * g < lo) return false;  // no multiple of g in [lo, hi]
    if (i == terms_.size()) return lo <= 0 && 0 <= hi;
    const Term& t = terms_[i];
    // t.coef * x + rest in [lo, hi] with rest in [suffix_min, suffix_max] of the later terms.
    wide x_lo = std::max(t.lo, ceil_div(lo - suffix_max_[i + 1], t.coef));
    wide x_hi = std::min(t.hi, floor_div(hi - suffix_min_[i + 1], t.coef));
    for (wide x = x_lo; x <= x_hi; ++x) {
      if (++work_ > kWorkLimit) {
        gave_up_ = true;
        return false;
      }
      if (search(i + 1, lo - t.coef * x, hi - t.coef * x)) return true;
      if (gave_up_) return false;
    }
    return false;
  }

  std::vector<Term> terms_;
  std::vector<wide> suffix_min_, suffix_max_, suffix_gcd_;
  long work_ = 0;
  bool gave_up_ = false;
};

// A tensor's bytes as runs: contiguous (stride-1) axes fold into the run width, extent-1 axes go.
struct Runs {
  wide base;
  wide width;
  std::vector<Term> axes;  // coef = byte stride, x in [0, extent - 1]
};

Runs runs_of(const TensorView& t) {
  Runs r{static_cast<wide>(t.data), t.itemsize(), {}};
  bool folded = false;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.dims[i] == 1) continue;
    if (t.strides[i] == 1 && !folded) {
      r.width *= t.dims[i];
      folded = true;
      continue;
    }
    r.axes.push_back({static_cast<wide>(t.strides[i]) * t.itemsize(), 0, t.dims[i] - 1});
  }
  return r;
}

void byte_range(const Runs& r, wide& first, wide& last) {  // inclusive
  first = r.base;
  last = r.base + r.width - 1;
  for (const auto& a : r.axes) {
    wide span = a.coef * a.hi;
    if (span < 0)
      first += span;
    else
      last += span;
  }
}

}  // namespace

Overlap memory_overlap(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return Overlap::none;
  Runs ra = runs_of(a), rb = runs_of(b);
  wide a_first, a_last, b_first, b_last;
  byte_range(ra, a_first, a_last);
  byte_range(rb, b_first, b_last);
  if (a_last < b_first || b_last < a_first) return Overlap::none;

  // start_a - start_b = (base_a - base_b) + sum ca*xa - sum cb*xb must lie in [-(wa-1), wb-1].
  std::vector<Term> terms = ra.axes;
  for (const auto& t : rb.axes) terms.push_back({-t.coef, t.lo, t.hi});
  const wide delta = ra.base - rb.base;
  return Solver(std::move(terms)).feasible(-(ra.width - 1) - delta, (rb.width - 1) - delta);
}

Overlap internal_overlap(const TensorView& t) {
  if (t.numel() <= 1) return Overlap::none;
  // In elements: two distinct indices collide iff sum stride_k * z_k == 0 for some nonzero z
  // with |z_k| < extent_k.
  std::vector<Term> axes;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.dims[i] == 1) continue;
    if (t.strides[i] == 0) return Overlap::overlaps;
    axes.push_back({t.strides[i] < 0 ? -static_cast<wide>(t.strides[i]) : t.strides[i], 0, t.dims[i] - 1});
  }
  // Fast path: each stride clears the whole span of the smaller ones (every dense or sliced layout).
  std::sort(axes.begin(), axes.end(), [](const Term& a, const Term& b) { return a.coef < b.coef; });
  wide span = 0;
  bool nested = true;
  for (const auto& a : axes) {
    if (a.coef <= span) {
      nested = false;
      break;
    }
    span += a.coef * a.hi;
  }
  if (nested) return Overlap::none;

  // Exact: z and -z are both solutions, so require the first nonzero coordinate (in descending
  // stride order) to be positive; try each axis as that pivot.
  std::reverse(axes.begin(), axes.end());
  bool gave_up = false;
  for (size_t p = 0; p < axes.size(); ++p) {
    std::vector<Term> terms;
    terms.push_back({axes[p].coef, 1, axes[p].hi});
    for (size_t j = p + 1; j < axes.size(); ++j) terms.push_back({axes[j].coef, -axes[j].hi, axes[j].hi});
    Overlap o = Solver(std::move(terms)).feasible(0, 0);
    if (o == Overlap::overlaps) return o;
    if (o == Overlap::unknown) gave_up = true;
  }
  return gave_up ? Overlap::unknown : Overlap::none;
}

}  // namespace stridedfa
