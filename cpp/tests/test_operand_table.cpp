// The operand table (sdpa_types.hpp kOperands) is the one statement of which operands a call has:
// these tests walk it row by row, so a new operand is one row, its kind's rule and the lines
// that put it into the graph. The FP8 scaling rows are that case, reserved until FP8 attention.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "stridedfa/errors.hpp"
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
