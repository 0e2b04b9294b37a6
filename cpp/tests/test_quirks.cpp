// The cuDNN quirks table (cudnn_quirks.hpp): one row per quirk in id order, each naming how it is
// handled and how it is reproduced, and a version range that decides whether it applies.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>

#include "stridedfa/cudnn_quirks.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/validate.hpp"
#include "views.hpp"

using namespace stridedfa;
using namespace stridedfa::testing;

TEST_CASE("the quirks table: rows in id order, unique names, each with its defect and its test") {
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Quirk::kCount); ++i) {
    const QuirkInfo& q = kQuirks[i];
    CHECK(static_cast<int>(q.id) == i);
    CHECK(&quirk_info(q.id) == &q);
    CHECK(names.insert(q.name).second);
    CHECK(std::strlen(q.defect) > 0);
    CHECK(std::strlen(q.test) > 0);
    CHECK(q.seen_in >= 90000);
    CHECK((q.fixed_in == 0 || q.fixed_in > q.seen_in));
  }
}

TEST_CASE("a quirk applies before the version that fixed it, and where the version is not known") {
  CHECK(quirk_applies(Quirk::varlen_backward_sinks, 91900));
  CHECK_FALSE(quirk_applies(Quirk::varlen_backward_sinks, 92600));
  CHECK(quirk_applies(Quirk::varlen_backward_sinks, 0));
  CHECK(quirk_applies(Quirk::varlen_backward_mqa_dk, 99900));  // none known fixed: every version
}

TEST_CASE("a refusal for a quirk cites it by name") {
  CallOperands a;
  a.op = GraphOp::backward;
  a.slot[kQ] = bshd("q", 1, 2, 8, 64, 0x7f0000000000);
  a.slot[kK] = bshd("k", 1, 2, 8, 64, 0x7f0000100000);
  a.slot[kV] = bshd("v", 1, 2, 8, 64, 0x7f0000200000);
  a.slot[kO] = bshd("out", 1, 2, 8, 64, 0x7f0000300000);
  a.slot[kLse] = view("lse", {1, 2, 8}, kF32, 0x7f0000400000);
  a.slot[kGradO] = bshd("grad_out", 1, 2, 8, 64, 0x7f0000500000);
  a.slot[kGradQ] = bshd("grad_q", 1, 2, 8, 64, 0x7f0000600000);
  a.slot[kGradK] = bshd("grad_k", 1, 2, 8, 64, 0x7f0000700000);
  a.slot[kGradV] = bshd("grad_v", 1, 2, 8, 64, 0x7f0000800000);
  a.slot[kBias] = view("bias", {1, 2, 1, 8}, kBF16, 0x7f0000900000);
  a.slot[kGradBias] = view("grad_bias", {1, 2, 1, 8}, kBF16, 0x7f0000a00000);
  CHECK_THROWS_WITH_AS(validate_call(a), doctest::Contains("[cuDNN quirk bias_grad_shared_rows]"), UnsupportedError);
}
