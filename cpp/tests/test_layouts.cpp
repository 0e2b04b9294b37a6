// Layout rules (layout_rules.hpp), intake's normalisation of DLPack (tensor_view.hpp) and the exact
// overlap test (overlap.hpp).
#include <doctest/doctest.h>

#include "stridedfa/errors.hpp"
#include "stridedfa/layout_rules.hpp"
#include "stridedfa/overlap.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

TEST_CASE("an output is dense in its input's axis order, extent-1 axes outermost") {
  const int64_t shape[4] = {2, 8, 128, 64};
  const int64_t bshd_strides[4] = {128 * 8 * 64, 64, 8 * 64, 1};
  int64_t strides[4];
  dense_strides_like(shape, bshd_strides, 4, strides);
  CHECK(strides[0] == 128 * 8 * 64);
  CHECK(strides[1] == 64);
  CHECK(strides[2] == 8 * 64);
  CHECK(strides[3] == 1);

  // A producer's stride on an extent-1 axis is arbitrary: it must not decide the layout.
  const int64_t one_head[4] = {2, 1, 128, 64};
  const int64_t odd[4] = {128 * 64, 1, 64, 1};
  dense_strides_like(one_head, odd, 4, strides);
  CHECK(is_dense(one_head, strides, 4));
  CHECK(strides[2] == 64);
  CHECK(strides[3] == 1);
}

TEST_CASE("density: exactly prod(shape) contiguous elements, in any axis order") {
  const int64_t shape[3] = {4, 3, 2};
  const int64_t row_major[3] = {6, 2, 1};
  const int64_t permuted[3] = {1, 8, 4};
  const int64_t gapped[3] = {12, 2, 1};
  const int64_t broadcast[3] = {0, 2, 1};
  CHECK(is_dense(shape, row_major, 3));
  CHECK(is_dense(shape, permuted, 3));
  CHECK_FALSE(is_dense(shape, gapped, 3));
  CHECK_FALSE(is_dense(shape, broadcast, 3));
}

TEST_CASE("a gradient takes its input's strides when dense, else dense in its axis order") {
  int64_t strides[4];
  const TensorView dense = bshd("q", 2, 8, 16, 64, 0x1000);
  gradient_strides(dense, strides);
  for (int i = 0; i < 4; ++i) CHECK(strides[i] == dense.strides[i]);

  // q sliced out of a packed (b, s, 3, h, d) buffer: the gradient is a dense bshd tensor.
  const TensorView packed = view("qkv", {2, 16, 3, 8, 64});
  const int to_logical[4] = {0, 2, 1, 3};  // (b, s, h, d) layout -> (b, h, s, d)
  const TensorView q = select_packed(packed, 2, 0, to_logical, "q");
  gradient_strides(q, strides);
  CHECK(strides[0] == 16 * 8 * 64);
  CHECK(strides[1] == 64);
  CHECK(strides[2] == 8 * 64);
  CHECK(strides[3] == 1);
}

TEST_CASE("views of one packed buffer: their own offsets, the buffer's strides, disjoint elements") {
  const TensorView packed = view("qkv", {2, 16, 3, 8, 64}, kBF16, 0x10000);
  const int to_logical[4] = {0, 2, 1, 3};
  const TensorView q = select_packed(packed, 2, 0, to_logical, "q");
  const TensorView k = select_packed(packed, 2, 1, to_logical, "k");
  const TensorView v = select_packed(packed, 2, 2, to_logical, "v");
  CHECK(q.dims[1] == 8);
  CHECK(q.dims[2] == 16);
  CHECK(q.strides[2] == 3 * 8 * 64);
  CHECK(k.data == q.data + 8 * 64 * 2);
  CHECK(v.data == q.data + 2 * 8 * 64 * 2);
  // Their address ranges interleave, but no byte is shared: the exact test says so.
  CHECK(memory_overlap(q, k) == Overlap::none);
  CHECK(memory_overlap(k, v) == Overlap::none);
  CHECK(memory_overlap(q, packed) == Overlap::overlaps);
}

TEST_CASE("overlap: shifted, broadcast and self-aliasing views") {
  const TensorView a = view("a", {4, 64}, kBF16, 0x1000);
  TensorView shifted = a;
  shifted.data += 63 * 2;  // the last element of a's first row
  CHECK(memory_overlap(a, shifted) == Overlap::overlaps);
  TensorView after = a;
  after.data += 4 * 64 * 2;
  CHECK(memory_overlap(a, after) == Overlap::none);

  CHECK(internal_overlap(a) == Overlap::none);
  const TensorView broadcast = view("b", {4, 64}, kBF16, 0x1000, {0, 1});
  CHECK(internal_overlap(broadcast) == Overlap::overlaps);
  const TensorView rows_overlap = view("c", {4, 64}, kBF16, 0x1000, {32, 1});
  CHECK(internal_overlap(rows_overlap) == Overlap::overlaps);
}

TEST_CASE("intake: NULL strides are row-major, byte_offset is folded into data") {
  int64_t shape[3] = {2, 3, 4};
  DLTensor t{};
  t.data = reinterpret_cast<void*>(0x1000);
  t.device = {kDLCUDA, 0};
  t.ndim = 3;
  t.dtype = kF16;
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 64;
  const TensorView v = view_from_dltensor(t, false, "q");
  CHECK(v.strides[0] == 12);
  CHECK(v.strides[1] == 4);
  CHECK(v.strides[2] == 1);
  CHECK(v.data == 0x1000 + 64);
}

TEST_CASE("intake repairs CuPy's unsigned stride division, and only with that quirk") {
  int64_t shape[1] = {8};
  // -64 bytes of float16 divided as size_t by 2: (2^64 - 64) / 2 = 2^63 - 32.
  int64_t exported[1] = {int64_t((uint64_t(0) - 64) / 2)};
  DLTensor t{};
  t.data = reinterpret_cast<void*>(0x100000);
  t.device = {kDLCUDA, 0};
  t.ndim = 1;
  t.dtype = kF16;
  t.shape = shape;
  t.strides = exported;
  const TensorView repaired = view_from_dltensor(t, false, "q", ExportQuirk::cupy_unsigned_strides);
  CHECK(repaired.strides[0] == -32);
  // Read as given, the stride reaches past any address memory can have: refused, naming the tensor.
  CHECK_THROWS_WITH_AS(view_from_dltensor(t, false, "q"), doctest::Contains("q"), LayoutError);
}

TEST_CASE("a layout no memory can hold is refused; an empty tensor passes whatever its strides") {
  TensorView huge = view("k", {2, 1 << 20}, kBF16, 0x1000, {int64_t(1) << 56, 1});
  CHECK_THROWS_AS(check_addressable(huge), LayoutError);
  TensorView below_zero = view("k", {4}, kBF16, 0x10, {-64});
  CHECK_THROWS_AS(check_addressable(below_zero), LayoutError);
  TensorView empty = view("k", {0, 8}, kBF16, 0x1000, {int64_t(1) << 60, -5});
  CHECK_NOTHROW(check_addressable(empty));
}

TEST_CASE("what is allocated for each output follows one rule per slot") {
  CallOperands call;
  // q: bshd memory of (2, 8, 16, 64); k, v: packed kv (2, 32, 2, 2, 64) viewed as (b, h, s, d).
  call.slot[kQ] = bshd("q", 2, 8, 16, 64, 0x10000000);
  call.slot[kK] = view("k", {2, 2, 32, 64}, kBF16, 0x20000000, {32 * 256, 64, 256, 1});
  call.slot[kV] = view("v", {2, 2, 32, 128}, kBF16, 0x30000000, {32 * 2 * 128, 128, 2 * 128, 1});
  call.slot[kBias] = view("bias", {1, 8, 1, 32}, kBF16, 0x40000000, {0, 32, 0, 1});

  const OutputLayout out = output_layout(call, kO);  // dense in q's (bshd) axis order, v's head_dim
  CHECK(out.ndim == 4);
  CHECK(out.shape[3] == 128);
  CHECK(out.strides[0] == 16 * 8 * 128);
  CHECK(out.strides[1] == 128);
  CHECK(out.strides[2] == 8 * 128);
  CHECK(out.dtype.code == kDLBfloat);

  const OutputLayout lse = output_layout(call, kLse);  // packed float32 (b, h, s)
  CHECK(lse.ndim == 3);
  CHECK(lse.strides[0] == 8 * 16);
  CHECK(lse.strides[1] == 16);
  CHECK(lse.strides[2] == 1);
  CHECK(lse.dtype.bits == 32);

  const OutputLayout grad_q = output_layout(call, kGradQ);  // q is dense: its own strides
  for (int i = 0; i < 4; ++i) CHECK(grad_q.strides[i] == call.slot[kQ].strides[i]);
  const OutputLayout grad_v = output_layout(call, kGradV);  // a strided view: dense in its axis order
  CHECK(grad_v.strides[3] == 1);
  CHECK(grad_v.strides[1] == 128);
  CHECK(grad_v.strides[2] == 2 * 128);

  const OutputLayout grad_sinks = output_layout(call, kGradSinks);
  CHECK(grad_sinks.ndim == 1);
  CHECK(grad_sinks.shape[0] == 8);

  const OutputLayout grad_bias = output_layout(call, kGradBias);  // contiguous, bias' shape
  CHECK(grad_bias.ndim == 4);
  CHECK(grad_bias.strides[3] == 1);
  CHECK(grad_bias.strides[1] == 32);
  CHECK(grad_bias.dtype.code == kDLBfloat);

  CHECK(output_layout(call, kQ).ndim == 0);  // an input: nothing to allocate
  call.slot[kQ] = view("q", {16, 64}, kBF16, 0x10000000);
  CHECK(output_layout(call, kO).ndim == 0);  // q of the wrong rank: the validator says so
}

TEST_CASE("a variable-length call's out and gradients are contiguous, its lse token-major (heads, tokens)") {
  CallOperands call;
  call.slot[kQ] = view("q", {100, 8, 64}, kBF16, 0x10000000, {3 * 8 * 64, 64, 1});  // a slice of packed qkv
  call.slot[kV] = view("v", {120, 2, 32}, kBF16, 0x20000000);
  call.slot[kCuSeqlensQ] = view("cu_seqlens_q", {3}, kI32, 0x30000000);
  const OutputLayout out = output_layout(call, kO);
  CHECK(out.ndim == 3);
  CHECK(out.shape[2] == 32);
  CHECK(out.strides[0] == 8 * 32);
  CHECK(out.strides[1] == 32);
  const OutputLayout lse = output_layout(call, kLse);
  CHECK(lse.ndim == 2);
  CHECK(lse.shape[0] == 8);
  CHECK(lse.shape[1] == 100);
  CHECK(lse.strides[0] == 1);
  CHECK(lse.strides[1] == 8);
  call.slot[kK] = view("k", {120, 2, 64}, kBF16, 0x40000000, {64, 120 * 64, 1});  // head-major
  const OutputLayout grad_q = output_layout(call, kGradQ);
  const OutputLayout grad_k = output_layout(call, kGradK);
  CHECK(grad_q.ndim == 3);
  CHECK(grad_q.strides[0] == 8 * 64);  // token-major, whatever q's and k's strides
  CHECK(grad_q.strides[1] == 64);
  CHECK(grad_k.strides[0] == 2 * 64);
  CHECK(grad_k.strides[1] == 64);
}
