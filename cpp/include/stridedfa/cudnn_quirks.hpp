// cuDNN's known defects and gaps that stridedfa refuses by name or works around: one row each, in
// one table, so that "why is this refused?" has one answer and a cuDNN that fixes a defect shows.
// Each row names the GPU test that reproduces it (tests/gpu/test_cudnn_quirks.py, with the refusal
// lifted through STRIDEDFA_LIFT_QUIRKS): on a cuDNN where it no longer reproduces, that test fails
// and the row's `fixed_in` is to be set. The code that refuses or works around cites the row's name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stridedfa {

enum class Quirk : int32_t {
  bias_grad_under_score_modifier = 0,
  bias_grad_packed_only,
  bias_grad_shared_rows,
  sinks_grad_under_dropout,
  unpacked_bias_one_by_one,
  sinks_with_one_query,
  backward_32bit_reach,
  varlen_backward_dense_queries,
  varlen_backward_mqa_dk,
  varlen_backward_sinks,
  varlen_backward_sm8x_sm12x,
  kCount
};

enum class Handling : int32_t { refused = 0, worked_around = 1 };

struct QuirkInfo {
  Quirk id;
  const char* name;  // cited by the code and the messages
  int64_t seen_in;   // the cuDNN version it was found in (91900: 9.19.0)
  int64_t fixed_in;  // the first cuDNN version without it; 0: none known
  Handling handling;
  const char* defect;  // what cuDNN does
  const char* test;    // the GPU test that reproduces it, or why none can
};

// clang-format off: one row per quirk
inline constexpr QuirkInfo kQuirks[] = {
    {Quirk::bias_grad_under_score_modifier, "bias_grad_under_score_modifier", 91900, 0, Handling::refused,
     "dbias comes back wrong under a score modifier (softcap, ALiBi)",
     "test_cudnn_quirks.py::test_bias_grad_under_score_modifier"},
    {Quirk::bias_grad_packed_only, "bias_grad_packed_only", 91900, 0, Handling::refused,
     "dbias is written only as a packed (row-major) tensor",
     "none: cuDNN refuses the graph itself (a support check, not a wrong result)"},
    {Quirk::bias_grad_shared_rows, "bias_grad_shared_rows", 91900, 0, Handling::refused,
     "dbias of a bias shared over query rows is wrong and written past its extent",
     "test_cudnn_quirks.py::test_bias_grad_shared_rows"},
    {Quirk::sinks_grad_under_dropout, "sinks_grad_under_dropout", 91900, 0, Handling::refused,
     "the sinks' gradient under dropout comes back scaled by 1 - dropout_p",
     "test_cudnn_quirks.py::test_sinks_grad_under_dropout"},
    {Quirk::unpacked_bias_one_by_one, "unpacked_bias_one_by_one", 91900, 0, Handling::refused,
     "with s_q = s_kv = 1 a bias that is not packed is misread into lse",
     "test_cudnn_quirks.py::test_unpacked_bias_one_by_one"},
    {Quirk::sinks_with_one_query, "sinks_with_one_query", 91900, 0, Handling::worked_around,
     "sinks with s_q = 1 are refused ('decode only mode ... not supported with sink_token'); the row is "
     "described twice at one address (call_plan.cpp one_query_with_sinks)",
     "test_cudnn_quirks.py::test_sinks_with_one_query"},
    {Quirk::backward_32bit_reach, "backward_32bit_reach", 91900, 0, Handling::refused,
     "the backward addresses out / grad_out within 2^32 bytes and q, k, v and their gradients within 2^32 "
     "elements; beyond, dq / dk are wrong or NaN",
     "none: a reproduction needs tensors of more than 4 GiB (validate.cpp require_32bit_reach)"},
    {Quirk::varlen_backward_dense_queries, "varlen_backward_dense_queries", 91900, 0, Handling::refused,
     "a variable-length backward computes dQ right only from dense token-major q and dQ",
     "test_cudnn_quirks.py::test_varlen_backward_dense_queries"},
    {Quirk::varlen_backward_mqa_dk, "varlen_backward_mqa_dk", 91900, 0, Handling::refused,
     "a variable-length backward computes a wrong dK when one key/value head serves several query heads "
     "(the adapters repeat k and v to two heads and sum the gradients)",
     "test_cudnn_quirks.py::test_varlen_backward_mqa_dk"},
    {Quirk::varlen_backward_sinks, "varlen_backward_sinks", 91900, 92600, Handling::refused,
     "a variable-length backward with sinks reads out of bounds",
     "none: fixed in 9.26 (an out-of-bounds read is not reproduced on purpose)"},
    {Quirk::varlen_backward_sm8x_sm12x, "varlen_backward_sm8x_sm12x", 91900, 0, Handling::refused,
     "cudnn-frontend refuses a variable-length backward (ragged statistics) on compute capability 8.x and 12.x",
     "none: a support check of the frontend on those GPUs"},
};
// clang-format on
static_assert(sizeof(kQuirks) / sizeof(kQuirks[0]) == static_cast<std::size_t>(Quirk::kCount), "one row per quirk");

const QuirkInfo& quirk_info(Quirk q);

// " [cuDNN quirk <name>]": how a refusal's message cites its row.
std::string quirk_tag(Quirk q);

// Whether stridedfa must refuse or work around `q` on cuDNN `cudnn_version` (0: not known, as in
// validation, which needs no cuDNN): the version is before the row's fixed_in, and a test has not
// lifted it (STRIDEDFA_LIFT_QUIRKS, a comma-separated list of names, read once: for the GPU tests
// that check a quirk still reproduces; never for real work).
bool quirk_applies(Quirk q, int64_t cudnn_version = 0);

// quirk_applies for the row of this name (the adapters' question, asked once at import); throws
// std::invalid_argument for a name the table does not have.
bool quirk_applies_named(const char* name, int64_t cudnn_version = 0);

}  // namespace stridedfa
