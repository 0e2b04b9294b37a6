// The operand table (sdpa_types.hpp kOperands) is the one statement of which operands a call has:
// these tests walk it row by row, so a new operand is one row, its kind's rule and the lines
// that put it into the graph. The FP8 scaling rows are that case, reserved until FP8 attention.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "stridedfa/errors.hpp"
#include "stridedfa/jax_ffi.hpp"
#include "stridedfa/validate.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

namespace {

constexpr std::uintptr_t kMiB = 1 << 20;

CallOperands dense_call(GraphOp op) {
  CallOperands a;
  a.op = op;
  std::uintptr_t address = 0x7f0000000000;
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    const bool required = role_in(op, s) != Role::absent && !optional_in(op, s);
    if (!required) continue;
    if (kind == OperandKind::attention) a.slot[s] = bshd(kOperands[s].name, 2, 4, 16, 64, address);
    if (kind == OperandKind::stats) a.slot[s] = view(kOperands[s].name, {2, 4, 16}, kF32, address);
    address += kMiB;
  }
  return a;
}

}  // namespace

TEST_CASE("each row has a unique name, a role in some op, and extents for every axis") {
  std::set<std::string> names;
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandInfo& row = kOperands[s];
    CAPTURE(row.name);
    CHECK(names.insert(row.name).second);
    CHECK((row.forward != Role::absent || row.backward != Role::absent));
    // An op that has no operand never calls it optional; a missing operand is only ever optional.
    if (row.forward == Role::absent) CHECK_FALSE(row.forward_optional);
    if (row.backward == Role::absent) CHECK_FALSE(row.backward_optional);
    CHECK(std::strlen(row.shape_meaning) > 0);
  }
}

TEST_CASE("the required operands of each op, read from the table, make a valid call") {
  for (GraphOp op : {GraphOp::forward, GraphOp::backward}) {
    CAPTURE(static_cast<int>(op));
    const Problem p = validate_call(dense_call(op));
    CHECK(p.b == 2);
    CHECK(p.h_q == 4);
  }
}

TEST_CASE("an operand given to an op that has none of it is refused by name") {
  for (int s = 0; s < kNumSlots; ++s) {
    for (GraphOp op : {GraphOp::forward, GraphOp::backward}) {
      if (role_in(op, s) != Role::absent) continue;
      CallOperands a = dense_call(op);
      a.slot[s] = view(kOperands[s].name, {1}, kF32, 0x7e0000000000);
      CAPTURE(kOperands[s].name);
      const std::string expected = std::string(kOperands[s].name) + " is not an operand";
      CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains(expected.c_str()), LayoutError);
    }
  }
}

TEST_CASE("the FP8 scaling rows are reserved: one row each, refused until FP8 attention lands") {
  int rows = 0;
  for (int s = 0; s < kNumSlots; ++s) {
    if (kOperands[s].kind != OperandKind::fp8_scale) continue;
    ++rows;
    CHECK(s > kBlockTable);  // appended after the rows that have graph lines
    for (GraphOp op : {GraphOp::forward, GraphOp::backward}) {
      if (role_in(op, s) == Role::absent) continue;
      CHECK(optional_in(op, s));
      CallOperands a = dense_call(op);
      a.slot[s] = view(kOperands[s].name, {1}, kF32, 0x7e0000000000);
      CAPTURE(kOperands[s].name);
      const std::string expected = std::string(kOperands[s].name) + " is an FP8";
      CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains(expected.c_str()), UnsupportedError);
    }
  }
  CHECK(rows == kAmaxGradV - kDescaleQ + 1);
}

TEST_CASE("the JAX handlers read their optional operands from the table: a bit per slot, in the table's order") {
  using jax_ffi::optional_bit;
  using jax_ffi::optional_operands;
  const int64_t all_forward = optional_bit(kSeqLensQ) | optional_bit(kSeqLensKV) | optional_bit(kSinks) |
                              optional_bit(kBias) | optional_bit(kAlibiSlopes) | optional_bit(kRngState) |
                              optional_bit(kCuSeqlensQ) | optional_bit(kCuSeqlensKV) | optional_bit(kBlockTable);
  const auto forward = optional_operands(all_forward, GraphOp::forward);
  REQUIRE(forward.num_arguments == 9);
  CHECK(forward.num_results == 0);
  const int expected[] = {kSeqLensQ, kSeqLensKV,  kSinks,       kBias,      kAlibiSlopes,
                          kRngState, kCuSeqlensQ, kCuSeqlensKV, kBlockTable};
  for (int i = 0; i < 9; ++i) CHECK(forward.arguments[i] == expected[i]);
  CHECK(optional_operands(0, GraphOp::forward).num_arguments == 0);
  // The backward: no block table; the sinks' and the bias' gradients are trailing results.
  const int64_t backward_bits = optional_bit(kSinks) | optional_bit(kGradSinks) | optional_bit(kBias) |
                                optional_bit(kGradBias) | optional_bit(kRngState);
  const auto backward = optional_operands(backward_bits, GraphOp::backward);
  REQUIRE(backward.num_arguments == 3);
  CHECK(backward.arguments[0] == kSinks);
  CHECK(backward.arguments[1] == kBias);
  CHECK(backward.arguments[2] == kRngState);
  REQUIRE(backward.num_results == 2);
  CHECK(backward.results[0] == kGradSinks);
  CHECK(backward.results[1] == kGradBias);
  // What a handler does not take is named: a block table in the backward, a gradient in the forward,
  // a fixed operand, an FP8 row (not yet), an unknown bit.
  CHECK_THROWS_WITH_AS(optional_operands(optional_bit(kBlockTable), GraphOp::backward),
                       doctest::Contains("block_table"), LayoutError);
  CHECK_THROWS_WITH_AS(optional_operands(optional_bit(kGradBias), GraphOp::forward), doctest::Contains("grad_bias"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(optional_operands(optional_bit(kQ), GraphOp::forward), doctest::Contains(": q "), LayoutError);
  CHECK_THROWS_WITH_AS(optional_operands(optional_bit(kDescaleQ), GraphOp::forward), doctest::Contains("descale_q"),
                       LayoutError);
  CHECK_THROWS_AS(optional_operands(optional_bit(62), GraphOp::forward), LayoutError);
  CHECK_THROWS_AS(optional_operands(-1, GraphOp::forward), LayoutError);
}
