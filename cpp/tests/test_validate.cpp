// The validator (validate.hpp validate_call): every rule answers before any
// launch, with a typed error that names the tensor, and accepts what cuDNN can read as given.
#include <doctest/doctest.h>

#include <string>

#include "stridedfa/errors.hpp"
#include "stridedfa/layout_rules.hpp"
#include "stridedfa/validate.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

namespace {

constexpr std::uintptr_t kMiB = 1 << 20;

// b = 2, 8 query heads over 2 key/value heads, s_q = 16, s_kv = 32, d = 64, every tensor bshd.
CallOperands gqa_forward() {
  CallOperands a;
  a.slot[kQ] = bshd("q", 2, 8, 16, 64, 0x7f0000000000);
  a.slot[kK] = bshd("k", 2, 2, 32, 64, 0x7f0000000000 + 1 * kMiB);
  a.slot[kV] = bshd("v", 2, 2, 32, 64, 0x7f0000000000 + 2 * kMiB);
  a.slot[kO] = bshd("out", 2, 8, 16, 64, 0x7f0000000000 + 3 * kMiB);
  a.slot[kLse] = view("lse", {2, 8, 16}, kF32, 0x7f0000000000 + 4 * kMiB);
  return a;
}

}  // namespace

TEST_CASE("a well-formed grouped-query call is accepted and read as one problem") {
  const Problem p = validate_call(gqa_forward());
  CHECK(p.b == 2);
  CHECK(p.h_q == 8);
  CHECK(p.h_kv == 2);
  CHECK(p.s_q == 16);
  CHECK(p.s_kv == 32);
  CHECK(p.d_qk == 64);
  CHECK(p.d_v == 64);
  CHECK_FALSE(p.ragged);
  CHECK_FALSE(p.paged);
}

TEST_CASE("q, k, v and out may be views of one packed buffer") {
  CallOperands a = gqa_forward();
  const TensorView qkv = view("qkv", {2, 32, 3, 2, 64}, kBF16, 0x7f0000000000);
  const int to_logical[4] = {0, 2, 1, 3};
  a.slot[kQ] = select_packed(qkv, 2, 0, to_logical, "q");
  a.slot[kK] = select_packed(qkv, 2, 1, to_logical, "k");
  a.slot[kV] = select_packed(qkv, 2, 2, to_logical, "v");
  a.slot[kO] = bshd("out", 2, 2, 32, 64, 0x7f0000000000 + 8 * kMiB);
  a.slot[kLse] = view("lse", {2, 2, 32}, kF32, 0x7f0000000000 + 9 * kMiB);
  CHECK(validate_call(a).h_q == 2);
}

TEST_CASE("shape disagreements name the tensor, the axis and both extents") {
  CallOperands a = gqa_forward();
  a.slot[kK] = bshd("k", 2, 2, 32, 128, a.slot[kK].data);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("k: head_dim (axis 3) is 128 but q's is 64"), LayoutError);
  a = gqa_forward();
  a.slot[kK] = bshd("k", 2, 3, 32, 64, a.slot[kK].data);
  a.slot[kV] = bshd("v", 2, 3, 32, 64, a.slot[kV].data);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("heads"), LayoutError);
  a = gqa_forward();
  a.slot[kV] = bshd("v", 1, 2, 32, 64, a.slot[kV].data);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("v: batch (axis 0) is 1"), LayoutError);
}

TEST_CASE("dtype, device and alignment are checked per operand") {
  CallOperands a = gqa_forward();
  a.slot[kQ].dtype = kF32;
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("q: dtype float32"), LayoutError);
  a = gqa_forward();
  a.slot[kV].device_type = kDLCPU;
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("v"), LayoutError);
  a = gqa_forward();
  a.slot[kK].data += 2;  // one element off a 16-byte boundary
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("k"), LayoutError);
}

TEST_CASE("an output that shares memory with an input is refused") {
  CallOperands a = gqa_forward();
  a.slot[kO].data = a.slot[kQ].data;
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("out"), LayoutError);
}

TEST_CASE("padding lengths are int32 vectors of the batch") {
  CallOperands a = gqa_forward();
  a.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI32, 0x7f0000000000 + 10 * kMiB);
  CHECK_NOTHROW(validate_call(a));
  a.slot[kSeqLensKV] = view("seqlens_kv", {3}, kI32, 0x7f0000000000 + 10 * kMiB);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("seqlens_kv"), LayoutError);
  a.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI64, 0x7f0000000000 + 10 * kMiB);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("seqlens_kv"), LayoutError);
}

TEST_CASE("a paged call needs each sequence's cached length") {
  CallOperands a = gqa_forward();
  a.slot[kK] = view("k", {10, 2, 16, 64}, kBF16, a.slot[kK].data);  // (blocks, h_kv, block_size, d)
  a.slot[kV] = view("v", {10, 2, 16, 64}, kBF16, a.slot[kV].data);
  a.slot[kBlockTable] = view("block_table", {2, 2}, kI32, 0x7f0000000000 + 11 * kMiB);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("seqlens_kv"), LayoutError);
  a.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI32, 0x7f0000000000 + 10 * kMiB);
  const Problem p = validate_call(a);
  CHECK(p.paged);
  CHECK(p.num_blocks == 10);
  CHECK(p.block_size == 16);
  CHECK(p.s_kv == 32);
}

TEST_CASE("the options' rules: a finite scale, non-negative window bounds, a positive softcap") {
  const Problem p = validate_call(gqa_forward());
  SdpaOptions options;
  CHECK_NOTHROW(validate_options(options, p));
  options.has_scale = true;
  options.scale = 1.0 / 0.0;
  CHECK_THROWS_WITH_AS(validate_options(options, p), doctest::Contains("scale"), LayoutError);
  options = SdpaOptions{};
  options.window_left = -2;
  CHECK_THROWS_WITH_AS(validate_options(options, p), doctest::Contains("window"), LayoutError);
  options = SdpaOptions{};
  options.softcap = -1.0;
  CHECK_THROWS_WITH_AS(validate_options(options, p), doctest::Contains("softcap"), LayoutError);
  options = SdpaOptions{};
  options.dropout_p = 0.1;  // dropout reads its Philox state from the rng_state operand
  CHECK_THROWS_WITH_AS(validate_options(options, p), doctest::Contains("needs rng_state"), LayoutError);
  Problem with_state = p;
  with_state.rng_state = true;
  CHECK_NOTHROW(validate_options(options, with_state));
  options = SdpaOptions{};
  options.alignment = static_cast<CausalAlignment>(2);  // a code from the JAX handlers' attribute
  CHECK_THROWS_WITH_AS(validate_options(options, p), doctest::Contains("causal_alignment code 2"), LayoutError);
}

TEST_CASE("option_fields names every option with its wire type and value, in the list's order") {
  SdpaOptions options;
  options.has_scale = true;
  options.scale = 0.125;
  options.alignment = CausalAlignment::bottom_right;
  options.window_left = 7;
  options.max_seqlen_kv = 4096;
  const auto fields = option_fields(options);
  REQUIRE(fields.size() == 11);
  std::string names;
  for (const auto& f : fields) names += std::string(f.name) + f.type + " ";
  CHECK(names ==
        "has_scaleb scaled causalb alignmenti window_lefti window_righti deterministicb softcapd dropout_pd "
        "max_seqlen_qi max_seqlen_kvi ");
  CHECK(fields[0].integer == 1);
  CHECK(fields[1].real == 0.125);
  CHECK(fields[3].integer == 1);
  CHECK(fields[4].integer == 7);
  CHECK(fields[5].integer == SdpaOptions::kUnbounded);
  CHECK(fields[10].integer == 4096);
}

TEST_CASE("a backward's gradients must match their inputs and not alias them") {
  CallOperands a = gqa_forward();  // q, k, v, out and lse as the forward had them
  a.op = GraphOp::backward;
  a.slot[kGradO] = bshd("grad_out", 2, 8, 16, 64, 0x7f0000000000 + 20 * kMiB);
  a.slot[kGradQ] = bshd("grad_q", 2, 8, 16, 64, 0x7f0000000000 + 21 * kMiB);
  a.slot[kGradK] = bshd("grad_k", 2, 2, 32, 64, 0x7f0000000000 + 22 * kMiB);
  a.slot[kGradV] = bshd("grad_v", 2, 2, 32, 64, 0x7f0000000000 + 23 * kMiB);
  CHECK(validate_call(a).h_kv == 2);
  a.slot[kGradK].data = a.slot[kK].data;
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("grad_k"), LayoutError);
  a.slot[kGradK] = bshd("grad_k", 2, 2, 32, 64, 0x7f0000000000 + 22 * kMiB);
  a.slot[kGradSinks] = view("grad_sinks", {8}, kF32, 0x7f0000000000 + 24 * kMiB);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("grad_sinks is given without sinks"), LayoutError);
}

TEST_CASE("an operand the op does not take is refused by name") {
  CallOperands a = gqa_forward();
  a.slot[kGradQ] = bshd("grad_q", 2, 8, 16, 64, 0x7f0000000000 + 21 * kMiB);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("grad_q is not an operand of the forward"), LayoutError);
}
