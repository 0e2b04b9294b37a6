// The 2-D blocks that fills and copies of strided regions are cut into (memops.hpp blocks_of),
// applied to host arrays as the driver's cuMemcpy2D / cuMemsetD2D would apply them, against an
// element-by-element copy: every element lands where its strides say, and a row-cut output takes
// one driver call, not one per (batch, head).
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "stridedfa/memops.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

namespace {

TensorView strided(std::vector<int64_t> dims, std::vector<int64_t> strides) {
  TensorView t = view("t", {1}, kF32);
  t.ndim = int32_t(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    t.dims[i] = dims[i];
    t.strides[i] = strides[i];
  }
  return t;
}

int64_t reach(const TensorView& t) {  // one past the largest element offset
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.dims[i] - 1) * t.strides[i];
  return last + 1;
}

// dst after copying src into it block by block, and element by element (both from the same start).
void copy_both_ways(const TensorView& src, const TensorView& dst, std::vector<int>& by_blocks,
                    std::vector<int>& by_elements) {
  std::vector<int> from(size_t(reach(src)));
  for (size_t i = 0; i < from.size(); ++i) from[i] = int(i) + 1;
  by_blocks.assign(size_t(reach(dst)), 0);
  by_elements = by_blocks;
  const Blocks2D b = blocks_of(src, dst);
  REQUIRE(b.src_pitch >= b.width);  // the driver's own requirement
  REQUIRE(b.dst_pitch >= b.width);
  for_each_block(b, [&](int64_t f, int64_t t) {
    for (int64_t r = 0; r < b.height; ++r) {
      for (int64_t c = 0; c < b.width; ++c)
        by_blocks.at(size_t(t + r * b.dst_pitch + c)) = from.at(size_t(f + r * b.src_pitch + c));  // in bounds
    }
  });
  int64_t index[kMaxDims] = {};
  while (true) {
    int64_t f = 0, t = 0;
    for (int i = 0; i < src.ndim; ++i) {
      f += index[i] * src.strides[i];
      t += index[i] * dst.strides[i];
    }
    by_elements[size_t(t)] = from[size_t(f)];
    int i = src.ndim - 1;
    for (; i >= 0; --i) {
      if (++index[i] < src.dims[i]) break;
      index[i] = 0;
    }
    if (i < 0) break;
  }
}

}  // namespace

TEST_CASE("a row-cut output's statistics are copied in one block, not one per (batch, head)") {
  // lse (8, 32, 8) cut to rows 1..7 (a bottom-right mask over fewer keys than queries), staged
  // packed: GPU run 68 spent ~300 µs in 256 copies of 7 floats at batch 8.
  const TensorView staged = strided({8, 32, 7}, {224, 7, 1});
  const TensorView user = strided({8, 32, 7}, {256, 8, 1});
  const Blocks2D b = blocks_of(staged, user);
  CHECK(b.count() == 1);
  CHECK(b.width == 7);
  CHECK(b.height == 256);
  CHECK(b.src_pitch == 7);
  CHECK(b.dst_pitch == 8);
  std::vector<int> blocks, elements;
  copy_both_ways(staged, user, blocks, elements);
  CHECK(blocks == elements);
  // The cut row of out, (8, 32, 1, 128) of (8, 32, 8, 128), filled: one memset.
  const TensorView row = strided({8, 32, 1, 128}, {32768, 1024, 128, 1});
  CHECK(blocks_of(row, row).count() == 1);
}

TEST_CASE("blocks of random strided copies put every element where its strides say") {
  std::mt19937 rng(20261207);
  for (int trial = 0; trial < 400; ++trial) {
    const int ndim = 1 + int(rng() % 4);
    std::vector<int64_t> dims(static_cast<size_t>(ndim));
    for (auto& d : dims) d = 1 + int64_t(rng() % 4);
    auto layout = [&](bool broadcast) {  // a random axis order, padding, and (src only) stride 0
      std::vector<int> order(static_cast<size_t>(ndim));
      for (int i = 0; i < ndim; ++i) order[size_t(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<int64_t> strides(static_cast<size_t>(ndim));
      int64_t step = 1;
      for (int k = ndim - 1; k >= 0; --k) {
        const int axis = order[size_t(k)];
        strides[size_t(axis)] = broadcast && rng() % 5 == 0 ? 0 : step;
        step *= dims[size_t(axis)] + int64_t(rng() % 3 == 0 ? rng() % 3 : 0);
      }
      return strided(dims, strides);
    };
    const TensorView src = layout(true), dst = layout(false);
    std::vector<int> blocks, elements;
    copy_both_ways(src, dst, blocks, elements);
    CHECK_MESSAGE(blocks == elements, "trial " << trial);
  }
}
