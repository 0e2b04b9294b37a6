// The call plan (call_plan.hpp): what cuDNN is handed once the mask's empty rows are cut off, the
// fills around it, and the core's own descriptions of what cuDNN refuses (one query row with sinks).
#include <doctest/doctest.h>

#include "stridedfa/call_plan.hpp"
#include "stridedfa/ragged.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/validate.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

namespace {

constexpr std::uintptr_t kBase = 0x7f0000000000;
constexpr std::uintptr_t kMiB = 1 << 20;
constexpr int64_t kCudnn = 91900;

CallOperands forward(int64_t s_q, int64_t s_kv) {
  CallOperands a;
  a.slot[kQ] = bshd("q", 2, 4, s_q, 64, kBase);
  a.slot[kK] = bshd("k", 2, 4, s_kv, 64, kBase + 1 * kMiB);
  a.slot[kV] = bshd("v", 2, 4, s_kv, 64, kBase + 2 * kMiB);
  a.slot[kO] = bshd("out", 2, 4, s_q, 64, kBase + 3 * kMiB);
  a.slot[kLse] = view("lse", {2, 4, s_q}, kF32, kBase + 4 * kMiB);
  return a;
}

// Validates, then plans, as prepare_call does.
struct Planned {
  OperandViews operands;
  Plan plan;

  Planned(const CallOperands& call, const SdpaOptions& options) : operands(call) {
    plan_call(call.op, validate_call(call), options, operands.slots, kCudnn, plan);
  }
};

}  // namespace

TEST_CASE("an unmasked call hands cuDNN the caller's tensors unchanged") {
  const CallOperands args = forward(16, 16);
  const Planned p(args, SdpaOptions{});
  CHECK(p.plan.problem.s_q == 16);
  CHECK(p.plan.n_fills == 0);
  CHECK(p.plan.n_empty_rows == 0);
  CHECK(p.plan.slots[kQ]->data == args.slot[kQ].data);
  CHECK(p.plan.slots[kQ]->strides[2] == args.slot[kQ].strides[2]);
}

TEST_CASE("bottom-right causal with more queries than keys: the rows that see no key are cut and filled") {
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  const CallOperands args = forward(24, 16);
  const Planned p(args, options);
  // Query i sees keys j <= i - 8: rows 0..7 see none.
  CHECK(p.plan.row_begin == 8);
  CHECK(p.plan.problem.s_q == 16);
  CHECK(p.plan.slots[kQ]->data == args.slot[kQ].data + 8 * args.slot[kQ].strides[2] * 2);
  REQUIRE(p.plan.n_fills == 2);  // out's rows with 0, lse's with -inf
  bool zero = false, minus_infinity = false;
  for (int i = 0; i < p.plan.n_fills; ++i) {
    CHECK(p.plan.fills[i].region.dims[2] == 8);
    zero |= p.plan.fills[i].pattern == 0u;
    minus_infinity |= p.plan.fills[i].pattern == kNegativeInfinityBits;
  }
  CHECK(zero);
  CHECK(minus_infinity);
}

TEST_CASE("padding lengths: the rows of empty sequences get their values after cuDNN") {
  CallOperands args = forward(16, 16);
  args.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI32, kBase + 5 * kMiB);
  const Planned p(args, SdpaOptions{});
  CHECK(p.plan.n_empty_rows == 2);  // out and lse
  for (int i = 0; i < p.plan.n_empty_rows; ++i) CHECK_FALSE(p.plan.empty_rows[i].key_side);
}

TEST_CASE("one query row with sinks is described as two rows at one address (cuDNN refuses s_q = 1)") {
  CallOperands args = forward(1, 40);
  args.slot[kSinks] = view("sinks", {4}, kF32, kBase + 6 * kMiB);
  const Planned p(args, SdpaOptions{});
  CHECK(p.plan.problem.s_q == 2);
  for (int s : {kQ, kO, kLse}) {
    CHECK(p.plan.slots[s]->dims[2] == 2);
    CHECK(p.plan.slots[s]->strides[2] == 0);  // no copy: the same row twice
    CHECK(p.plan.slots[s]->data == p.operands.slots[s]->data);
  }
  CHECK(p.plan.slots[kK] == p.operands.slots[kK]);  // the KV cache is read as given
}

TEST_CASE("one query row with sinks and ALiBi is refused by name (the two rows' distances differ)") {
  CallOperands args = forward(1, 40);
  args.slot[kSinks] = view("sinks", {4}, kF32, kBase + 6 * kMiB);
  args.slot[kAlibiSlopes] = view("alibi_slopes", {4}, kF32, kBase + 7 * kMiB);
  CHECK_THROWS_WITH_AS(Planned(args, SdpaOptions{}), doctest::Contains("ALiBi"), UnsupportedError);
}

TEST_CASE("fill_empty_rows spreads few (sequence, head) pairs over enough blocks, never a block per few rows") {
  // the padded transformers step that found it: (2, 8, 2048, 128) -> 16 pairs of 262,144 elements
  CHECK(stridedfa::empty_rows_blocks_per_head(16, 2048 * 128) == 64);
  CHECK(stridedfa::empty_rows_blocks_per_head(16, 2048) == 2);          // lse rows: a block per 1024 elements
  CHECK(stridedfa::empty_rows_blocks_per_head(4096, 2048 * 128) == 1);  // the pairs alone fill the GPU
  CHECK(stridedfa::empty_rows_blocks_per_head(300, 1 << 20) == 4);
  CHECK(stridedfa::empty_rows_blocks_per_head(1, 0) == 1);
  CHECK(stridedfa::empty_rows_blocks_per_head(0, 100) == 1);
}
