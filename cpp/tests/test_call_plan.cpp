// The call plan (call_plan.hpp): what cuDNN is handed once the mask's empty rows are cut off, the
// fills around it, and the core's own descriptions of what cuDNN refuses (one query row with sinks).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

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

// Decoding planned at its exact extents for one test case (STRIDEDFA_DECODE_GRAPHS=exact): the
// cases of the exact plan's own rules, which decoding by heads (the default) would take over.
struct ExactDecodeGraphs {
  bool before = decode_graphs_bucketed();
  ExactDecodeGraphs() { set_decode_graphs_bucketed(false); }
  ~ExactDecodeGraphs() { set_decode_graphs_bucketed(before); }
};

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
  const ExactDecodeGraphs exact;
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
  const ExactDecodeGraphs exact;
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

namespace {

// Decode graphs bucketed in their ragged form (STRIDEDFA_DECODE_GRAPHS=ragged) for one test case,
// as before after; the paged view's own test case turns the view on.
struct BucketedDecodeGraphs {
  bool before = decode_graphs_bucketed();
  bool paged_view_before = false;
  BucketedDecodeGraphs() {
    set_decode_graphs_bucketed(true);
    paged_view_before = decode_heads_paged();
    set_decode_heads_paged(false);
  }
  ~BucketedDecodeGraphs() {
    set_decode_heads_paged(paged_view_before);
    set_decode_graphs_bucketed(before);
  }
};

// One decoding step: q (2, 8, s_q, 64) against a cache of L keys on 2 key/value heads, head-major
// ((b, h, s, d) contiguous, as transformers' dynamic cache holds it) or token-major.
CallOperands decode(int64_t s_q, int64_t L, bool head_major = true) {
  CallOperands a;
  const auto cache = [&](const char* name, std::uintptr_t at) {
    return head_major ? view(name, {2, 2, L, 64}, kBF16, at) : bshd(name, 2, 2, L, 64, at);
  };
  a.slot[kQ] = view("q", {2, 8, s_q, 64}, kBF16, kBase);
  a.slot[kK] = cache("k", kBase + 1 * kMiB);
  a.slot[kV] = cache("v", kBase + 2 * kMiB);
  a.slot[kO] = view("out", {2, 8, s_q, 64}, kBF16, kBase + 3 * kMiB);
  return a;
}

// What the graph is built from: every slot's declared dims and strides (addresses aside).
std::vector<int64_t> declared(const Plan& plan) {
  std::vector<int64_t> out;
  for (const TensorView* t : plan.slots) {
    out.push_back(t != nullptr);
    if (!t) continue;
    out.insert(out.end(), t->dims, t->dims + 4);
    out.insert(out.end(), t->strides, t->strides + 4);
  }
  out.push_back(plan.ragged.declared_total_q());
  out.push_back(plan.ragged.declared_total_kv());
  return out;
}

}  // namespace

TEST_CASE("a decoding step is described by heads: each (batch, key/value head) one sequence of the group's queries") {
  const BucketedDecodeGraphs bucketed;
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  const Planned p(decode(1, 300), options);
  const RaggedPlan& r = p.plan.ragged;
  REQUIRE(r.on);
  CHECK(r.by_heads);
  CHECK(r.sequences == 4);
  CHECK(r.heads_kv == 2);
  CHECK(r.len_q == 1);
  CHECK(r.len_kv == 300);
  CHECK(r.max_kv == 512);  // a power of two: one graph per doubling of the cache
  CHECK(p.plan.problem.h_q == 4);
  CHECK(p.plan.problem.h_kv == 1);
  const TensorView& k = *p.plan.slots[kK];
  CHECK(k.dims[0] == r.padded_sequences);
  CHECK(k.dims[1] == 1);
  CHECK(k.dims[2] == 512);
  CHECK(k.strides[2] == 64);
  CHECK(k.data == kBase + 1 * kMiB);  // the offsets address each sequence
  // k: entry i, head j starts at i * (2 x 300 x 64) + j * (300 x 64); q's group j at j x 4 heads x 64.
  const int kr = r.row_of[kK], qr = r.row_of[kQ];
  CHECK(r.rows[kr] == 2 * 300 * 64);
  CHECK(r.head_strides[kr] == 300 * 64);
  CHECK(r.rows[qr] == 8 * 64);
  CHECK(r.head_strides[qr] == 4 * 64);
  CHECK(r.row_of[kO] == qr);  // out is laid out like q: one offsets row
  CHECK(p.plan.n_fills == 0);
  CHECK(p.plan.n_empty_rows == 0);
}

TEST_CASE("a decoding loop of 1,000 growing cache lengths declares one problem per doubling") {
  const BucketedDecodeGraphs bucketed;
  for (bool head_major : {true, false}) {
    std::vector<std::vector<int64_t>> seen;
    for (int64_t L = 300; L < 1300; ++L) {
      const Planned p(decode(1, L, head_major), SdpaOptions{});
      const std::vector<int64_t> d = declared(p.plan);
      if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
    }
    CHECK(seen.size() == 3);  // 512, 1024, 2048 keys
  }
}

TEST_CASE("exact decode graphs (STRIDEDFA_DECODE_GRAPHS=exact) plan decoding exactly") {
  const ExactDecodeGraphs exact;
  const Planned p(decode(1, 300), SdpaOptions{});
  CHECK_FALSE(p.plan.ragged.on);
  CHECK(p.plan.slots[kK]->dims[2] == 300);
}

TEST_CASE("decoding by heads leaves what it cannot describe to the exact plan") {
  const BucketedDecodeGraphs bucketed;
  CallOperands sinks_and_lengths = decode(1, 300);
  sinks_and_lengths.slot[kSinks] = view("sinks", {8}, kF32, kBase + 6 * kMiB);
  sinks_and_lengths.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI32, kBase + 7 * kMiB);
  CallOperands with_bias = decode(1, 300);
  with_bias.slot[kBias] = view("bias", {2, 1, 1, 300}, kBF16, kBase + 6 * kMiB);
  CallOperands prompt = decode(300, 300);  // self-attention: no cache
  CallOperands many_queries = decode(17, 300);
  for (const CallOperands* call : {&sinks_and_lengths, &with_bias, &prompt, &many_queries}) {
    const Planned p(*call, SdpaOptions{});
    CHECK_FALSE(p.plan.ragged.on);
  }
  CallOperands lengths = decode(1, 300);
  lengths.slot[kSeqLensKV] = view("seqlens_kv", {2}, kI32, kBase + 6 * kMiB);
  const Planned with_lengths(lengths, SdpaOptions{});
  CHECK(with_lengths.plan.ragged.by_heads);  // the cache's lengths, read by the offsets kernel
  CHECK(with_lengths.plan.ragged.callers_kv.data == kBase + 6 * kMiB);
  CHECK(with_lengths.plan.n_empty_rows == 1);  // out's rows of a sequence with no keys
}

TEST_CASE("decoding by heads declares tensors that cover all their offsets reach (a static cache's heads)") {
  const BucketedDecodeGraphs bucketed;
  // One batch entry, 8 key/value heads of a 4096-token static cache, 200 tokens filled.
  CallOperands a;
  a.slot[kQ] = view("q", {1, 32, 1, 128}, kBF16, kBase);
  a.slot[kK] = view("k", {1, 8, 200, 128}, kBF16, kBase + 1 * kMiB, {8 * 4096 * 128, 4096 * 128, 128, 1});
  a.slot[kV] = view("v", {1, 8, 200, 128}, kBF16, kBase + 64 * kMiB, {8 * 4096 * 128, 4096 * 128, 128, 1});
  a.slot[kO] = view("out", {1, 32, 1, 128}, kBF16, kBase + 128 * kMiB);
  const Planned p(a, SdpaOptions{});
  REQUIRE(p.plan.ragged.by_heads);
  const TensorView& k = *p.plan.slots[kK];
  const int64_t reach = 7 * 4096 * 128 + 199 * 128 + 128;  // the last head's last key
  CHECK(k.dims[0] * k.strides[0] >= reach);
  CHECK(k.dims[2] == 256);
  // A longer fill declares the same tensors: the cover follows the capacity, not the fill.
  a.slot[kK].dims[2] = a.slot[kV].dims[2] = 250;
  const Planned longer(a, SdpaOptions{});
  CHECK(longer.plan.slots[kK]->strides[0] == k.strides[0]);
}

TEST_CASE("decoding by heads needs each batch entry outside its heads (offsets that never decrease)") {
  const BucketedDecodeGraphs bucketed;
  CallOperands a = decode(1, 300);
  // heads outside the batch: (h, b, L, d) memory
  a.slot[kK] = view("k", {2, 2, 300, 64}, kBF16, kBase + 1 * kMiB, {300 * 64, 2 * 300 * 64, 64, 1});
  a.slot[kV] = view("v", {2, 2, 300, 64}, kBF16, kBase + 2 * kMiB, {300 * 64, 2 * 300 * 64, 64, 1});
  const Planned p(a, SdpaOptions{});
  CHECK_FALSE(p.plan.ragged.on);
}

namespace {

struct SplitKvOn {
  bool before = split_kv_enabled();
  SplitKvOn() { set_split_kv_enabled(true); }
  ~SplitKvOn() { set_split_kv_enabled(before); }
};

// One paged decoding step: q (b, 32, s_q, 128) against 8 key/value heads in blocks of 16 keys, a
// table of `blocks` columns per entry.
CallOperands paged_decode(int64_t b, int64_t blocks, int64_t s_q = 1, bool lse = false) {
  CallOperands a;
  a.slot[kQ] = view("q", {b, 32, s_q, 128}, kBF16, kBase);
  a.slot[kK] = view("k", {4096, 8, 16, 128}, kBF16, kBase + 64 * kMiB);
  a.slot[kV] = view("v", {4096, 8, 16, 128}, kBF16, kBase + 256 * kMiB);
  a.slot[kO] = view("out", {b, 32, s_q, 128}, kBF16, kBase + 8 * kMiB);
  if (lse) a.slot[kLse] = view("lse", {b, 32, s_q}, kF32, kBase + 9 * kMiB);
  a.slot[kBlockTable] = view("block_table", {b, blocks}, kI32, kBase + 10 * kMiB);
  a.slot[kSeqLensKV] = view("seqlens_kv", {b}, kI32, kBase + 11 * kMiB);
  return a;
}

}  // namespace

TEST_CASE("split-KV: a paged decoding step at batch 1 becomes chunks of its keys, merged after cuDNN") {
  CHECK(split_kv_chunks(1, 32, 8192) == 8);  // 256 thread blocks
  CHECK(split_kv_chunks(1, 32, 1024) == 4);  // chunks of at least 256 keys
  CHECK(split_kv_chunks(1, 32, 300) == 1);
  CHECK(split_kv_chunks(4, 32, 8192) == 2);
  CHECK(split_kv_chunks(8, 32, 8192) == 1);  // the batch alone fills the GPU
  CHECK(split_kv_chunks(1, 1, 1 << 20) == 64);
  const SplitKvOn on;
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  const Planned p(paged_decode(1, 512), options);
  const SplitKv& s = p.plan.split;
  REQUIRE(s.on);
  CHECK(s.chunks == 8);
  CHECK(s.blocks_per_chunk == 64);
  CHECK(s.keys_per_chunk == 1024);
  CHECK(p.plan.problem.b == 8);
  CHECK(p.plan.unmasked);  // one query sees all its keys: the padding mask is the whole mask
  const TensorView& q = *p.plan.slots[kQ];
  CHECK(q.data == 0);  // the launch's scratch
  CHECK(q.dims[0] == 8);
  CHECK(q.strides[0] == 32 * 128);
  REQUIRE(p.plan.slots[kLse]);  // the merge needs every chunk's statistics, asked for or not
  CHECK(p.plan.slots[kLse]->dims[0] == 8);
  CHECK(p.plan.slots[kLse]->dtype.bits == 32);
  const TensorView& table = *p.plan.slots[kBlockTable];
  CHECK(table.dims[0] == 8);
  CHECK(table.dims[2] == 64);
  CHECK(table.strides[0] == 64);  // the entries' packed rows, read a chunk at a time
  CHECK(p.plan.slots[kSeqLensQ]->dims[0] == 8);
  CHECK(p.plan.slots[kSeqLensKV]->data == 0);
  CHECK(p.plan.n_empty_rows == 0);  // the merge writes 0 and -inf for an entry of no keys
  CHECK(s.q.data == kBase);
  CHECK(s.out.data == kBase + 8 * kMiB);
  CHECK_FALSE(s.lse.present);
  CHECK(split_kv_bytes(s) >= 8 * 32 * 128 * 2 * 2 + 8 * 32 * 4 + 2 * 8 * 4);
  void* scratch = reinterpret_cast<void*>(kBase);
  CHECK(split_kv_part(s, scratch, SplitPart::lengths_kv) ==
        static_cast<char*>(split_kv_part(s, scratch, SplitPart::lengths_q)) + 8 * 4);
}

TEST_CASE("decoding by tokens: a paged step of a few queries becomes one one-query sequence per token") {
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  CallOperands call = paged_decode(4, 64, 3);
  call.slot[kQ] = bshd("q", 4, 32, 3, 128, kBase);  // token-major inside each entry: (b, s, h, d) memory
  call.slot[kO] = bshd("out", 4, 32, 3, 128, kBase + 8 * kMiB);
  call.slot[kLse] = view("lse", {4, 32, 3}, kF32, kBase + 9 * kMiB, {3 * 32, 1, 32});
  const Planned p(call, options);
  const ByTokens& t = p.plan.by_tokens;
  REQUIRE(t.on);
  CHECK(t.queries == 3);
  CHECK(t.causal);
  CHECK(t.full_len == 64 * 16);
  CHECK(p.plan.unmasked);  // each token's length is its whole mask
  CHECK(p.plan.problem.b == 12);
  CHECK(p.plan.problem.s_q == 1);
  for (int s : {kQ, kO, kLse}) {
    const TensorView& v = *p.plan.slots[s];
    CHECK(v.dims[0] == 12);
    CHECK(v.dims[2] == 1);
    CHECK(v.strides[0] == p.operands.slots[s]->strides[2]);  // the next token, then the next entry's first
    CHECK(v.data == p.operands.slots[s]->data);
  }
  const TensorView& table = *p.plan.slots[kBlockTable];
  CHECK(table.dims[0] == 12);  // each entry's row repeated, by the launch's copy
  CHECK(table.dims[2] == 64);
  CHECK(p.plan.made_lengths[0] == 1);
  CHECK(p.plan.slots[kSeqLensKV]->dims[0] == 12);
  CHECK(p.plan.slots[kSeqLensKV]->data == 0);  // made beside the table copy
  CHECK(p.plan.n_empty_rows == 2);             // tokens with no key: out 0, lse -inf
  CHECK(Planned(call, SdpaOptions{}).plan.by_tokens.on);
  CHECK_FALSE(Planned(call, SdpaOptions{}).plan.by_tokens.causal);

  // What a length cannot say, or what has no (b x s) axis, keeps cuDNN's general kernel.
  SdpaOptions top_left;
  top_left.causal = true;
  CHECK_FALSE(Planned(call, top_left).plan.by_tokens.on);
  SdpaOptions window = options;
  window.window_left = 100;
  CHECK_FALSE(Planned(call, window).plan.by_tokens.on);
  CHECK_FALSE(Planned(paged_decode(4, 64, 3), options).plan.by_tokens.on);  // (b, h, s, d) memory
  CHECK(Planned(paged_decode(1, 64, 3), options).plan.by_tokens.on);        // one entry: any layout
  CHECK(Planned(paged_decode(1, 64, 8), options).plan.by_tokens.on);        // one entry: up to 8 tokens pay
  CHECK_FALSE(Planned(paged_decode(1, 64, 9), options).plan.by_tokens.on);  // more tokens than pay
  CallOperands five = paged_decode(4, 64, 5);
  five.slot[kQ] = bshd("q", 4, 32, 5, 128, kBase);
  five.slot[kO] = bshd("out", 4, 32, 5, 128, kBase + 8 * kMiB);
  CHECK_FALSE(Planned(five, options).plan.by_tokens.on);  // several entries: up to 4
  set_decode_by_tokens(false);
  CHECK_FALSE(Planned(call, options).plan.by_tokens.on);
  set_decode_by_tokens(true);
  // cuDNN before 9.12 writes only packed statistics: with an lse, the general kernel.
  Plan old;
  const OperandViews views(call);
  plan_call(call.op, validate_call(call), options, views.slots, 91100, old);
  CHECK_FALSE(old.by_tokens.on);
  call.slot[kLse] = TensorView{};
  const OperandViews without_lse(call);
  Plan old_without_lse;
  plan_call(call.op, validate_call(call), options, without_lse.slots, 91100, old_without_lse);
  CHECK(old_without_lse.by_tokens.on);
}

TEST_CASE("a prefix and a tail: 5-8 causal queries over a long cache (3-8 at batch 32), tokens folded into the heads") {
  struct PrefixTailOn {  // on by default; on here whatever an earlier case left
    bool before = decode_prefix_tail();
    PrefixTailOn() { set_decode_prefix_tail(true); }
    ~PrefixTailOn() { set_decode_prefix_tail(before); }
  } on;
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  CallOperands call = paged_decode(4, 512, 8, true);  // (b, h, s, d) memory: any layout, q is copied
  const Planned p(call, options);
  CHECK_FALSE(p.plan.by_tokens.on);
  const SplitKv& s = p.plan.split;
  REQUIRE(s.on);
  REQUIRE(s.prefix_tail());
  CHECK(s.tokens == 8);
  CHECK(s.chunks == 9);  // the prefix, then each token's tail
  CHECK(s.heads == 32 * 8);
  CHECK(s.block_size == 16);
  CHECK(s.blocks_per_chunk == 512);  // every chunk a whole row of the table copy
  CHECK(s.full_len == 512 * 16);
  CHECK(s.lse.present);
  CHECK(p.plan.unmasked);
  CHECK(p.plan.problem.b == 4 * 9);
  CHECK(p.plan.problem.h_q == 256);
  CHECK(p.plan.problem.s_q == 1);
  const TensorView& q = *p.plan.slots[kQ];
  CHECK(q.data == 0);  // the launch's scratch
  CHECK(q.dims[0] == 36);
  CHECK(q.dims[1] == 256);
  CHECK(q.strides[0] == 256 * 128);
  CHECK(p.plan.slots[kK]->dims[1] == 8);  // each kv head's group: its 4 query heads x 8 tokens
  const TensorView& table = *p.plan.slots[kBlockTable];
  CHECK(table.dims[0] == 36);
  CHECK(table.dims[2] == 512);
  CHECK(table.strides[0] == 512);
  CHECK(p.plan.slots[kSeqLensKV]->data == 0);
  CHECK(p.plan.n_empty_rows == 0);  // the merge writes a token without keys
  CHECK(split_kv_bytes(s) >= 36 * 256 * 128 * 2 * 2 + 36 * 256 * 4);
  // A different graph from the general kernel's, and from the same call by tokens.
  set_decode_prefix_tail(false);
  const Planned general(call, options);
  set_decode_prefix_tail(true);
  CHECK_FALSE(general.plan.split.on);
  CHECK(general.plan.problem.s_q == 8);

  // What the prefix cannot say, or where it does not pay, keeps the other plans.
  CHECK_FALSE(Planned(paged_decode(4, 512, 4), options).plan.split.on);  // 2-4 tokens: by tokens
  CHECK_FALSE(Planned(paged_decode(4, 512, 9), options).plan.split.on);  // more than 8 (16: slower)
  CHECK_FALSE(Planned(paged_decode(1, 512, 8), options).plan.split.on);  // one entry: by tokens
  CHECK(Planned(paged_decode(1, 512, 8), options).plan.by_tokens.on);
  CHECK(Planned(paged_decode(32, 512, 3), options).plan.split.prefix_tail());  // 3-4 from batch 32
  CHECK_FALSE(Planned(paged_decode(16, 512, 3), options).plan.split.on);
  CHECK_FALSE(Planned(paged_decode(32, 512, 2), options).plan.split.on);  // 2: by tokens
  CHECK_FALSE(Planned(paged_decode(4, 64, 8), options).plan.split.on);    // 1k keys: the tail eats the gain
  CHECK_FALSE(Planned(paged_decode(4, 65, 8), options).plan.split.on);    // 1,040 keys, declared 128 blocks wide
  CallOperands wide = paged_decode(512, 512, 8);  // copies of q and the partials past 128M elements each
  wide.slot[kO] = view("out", {512, 32, 8, 128}, kBF16, kBase + 1024 * kMiB);
  wide.slot[kBlockTable] = view("block_table", {512, 512}, kI32, kBase + 1100 * kMiB);
  wide.slot[kSeqLensKV] = view("seqlens_kv", {512}, kI32, kBase + 1110 * kMiB);
  CHECK_FALSE(Planned(wide, options).plan.split.on);
  CHECK_FALSE(Planned(call, SdpaOptions{}).plan.split.on);  // unmasked
  SdpaOptions top_left;
  top_left.causal = true;
  CHECK_FALSE(Planned(call, top_left).plan.split.on);
  SdpaOptions window = options;
  window.window_left = 100;
  CHECK_FALSE(Planned(call, window).plan.split.on);
  set_decode_prefix_tail(false);
  CHECK_FALSE(Planned(call, options).plan.split.on);
  set_decode_prefix_tail(true);
}

TEST_CASE("a prefix and a tail described by rows: a key head's group x tokens as the general kernel's query rows") {
  struct RowsOn {  // off by default
    bool before = decode_prefix_tail(), rows_before = decode_prefix_tail_rows();
    RowsOn() {
      set_decode_prefix_tail(true);
      set_decode_prefix_tail_rows(true);
    }
    ~RowsOn() {
      set_decode_prefix_tail(before);
      set_decode_prefix_tail_rows(rows_before);
    }
  } on;
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  const Planned p(paged_decode(4, 512, 8, true), options);
  const SplitKv& s = p.plan.split;
  REQUIRE(s.prefix_tail());
  CHECK(s.heads == 32 * 8);       // the same packed scratch as by heads ...
  CHECK(s.rows == 4 * 8);         // ... read as 8 key heads of 32 rows
  CHECK(s.prefix_chunks() == 4);  // 4 x 4 x 8 = 128 thread blocks of the general kernel
  CHECK(s.blocks_per_chunk == 128);
  CHECK(s.chunks == 4 + 8);
  CHECK(s.tail_rows().prefix_chunks == 4);
  CHECK(s.tail_rows().chunk_blocks == 128);
  CHECK(table_copies(ByTokens{}, s.tail_rows()) == 12);
  CHECK(p.plan.unmasked);
  CHECK(p.plan.problem.b == 4 * 12);
  CHECK(p.plan.problem.s_kv == 128 * 16);
  CHECK(p.plan.slots[kBlockTable]->dims[2] == 128);  // a chunk's blocks of the copy's 512-wide rows
  CHECK(p.plan.slots[kBlockTable]->strides[0] == 512);
  CHECK(p.plan.problem.h_q == 8);
  CHECK(p.plan.problem.h_kv == 8);
  CHECK(p.plan.problem.s_q == 32);
  for (int slot : {kQ, kO, kLse}) {
    const TensorView& t = *p.plan.slots[slot];
    const int64_t inner = slot == kLse ? 1 : 128;
    CHECK(t.data == 0);
    CHECK(t.dims[1] == 8);
    CHECK(t.dims[2] == 32);
    CHECK(t.strides[0] == 256 * inner);
    CHECK(t.strides[1] == 32 * inner);
    CHECK(t.strides[2] == inner);
  }
  CHECK(split_kv_bytes(s) >= 48 * 256 * 128 * 2 * 2 + 48 * 256 * 4);
  CHECK(prefix_tail_chunks(32, 8, 512) == 1);  // 256 thread blocks already
  CHECK(prefix_tail_chunks(8, 8, 512) == 2);
  CHECK(prefix_tail_chunks(1, 8, 512) == 16);
  CHECK(prefix_tail_chunks(1, 8, 128) == 8);  // chunks of at least 16 blocks
  // Another graph than by heads; 3-16 tokens, one entry too, never 2 tokens (by tokens).
  set_decode_prefix_tail_rows(false);
  const Planned by_heads(paged_decode(4, 512, 8, true), options);
  set_decode_prefix_tail_rows(true);
  CHECK(by_heads.plan.problem.s_q == 1);
  CHECK(by_heads.plan.split.rows == 1);
  CHECK(Planned(paged_decode(8, 512, 16), options).plan.split.rows == 64);
  CHECK(Planned(paged_decode(8, 512, 3), options).plan.split.prefix_tail());
  CHECK_FALSE(Planned(paged_decode(8, 512, 17), options).plan.split.on);
  CHECK_FALSE(Planned(paged_decode(8, 512, 2), options).plan.split.on);
  CHECK(Planned(paged_decode(1, 512, 16), options).plan.split.prefix_chunks() == 16);
  const bool bucketed = decode_graphs_bucketed();
  set_decode_graphs_bucketed(false);  // the caller's width, 1,000 blocks: the chunks still cover it
  const Planned exact(paged_decode(1, 1000, 16), options);
  set_decode_graphs_bucketed(bucketed);
  CHECK(exact.plan.split.prefix_chunks() == 16);
  CHECK(exact.plan.split.prefix_chunks() * exact.plan.split.blocks_per_chunk >= 1000);
  CHECK(exact.plan.slots[kBlockTable]->strides[0] == 1000);             // the copy's rows, whole
  CHECK_FALSE(Planned(paged_decode(4, 64, 8), options).plan.split.on);  // 1k keys
}

TEST_CASE("split-KV leaves alone what a chunk would get wrong or what already fills the GPU") {
  const SplitKvOn on;
  CHECK_FALSE(Planned(paged_decode(8, 512), SdpaOptions{}).plan.split.on);     // 256 blocks already
  CHECK_FALSE(Planned(paged_decode(1, 512, 2), SdpaOptions{}).plan.split.on);  // two queries: a band per chunk
  SdpaOptions top_left;
  top_left.causal = true;  // one query at the top-left diagonal sees key 0 only
  CHECK_FALSE(Planned(paged_decode(1, 512), top_left).plan.split.on);
  SdpaOptions window;
  window.alignment = CausalAlignment::bottom_right;
  window.window_left = 127;  // the one row sees the last 128 of up to 512 keys
  CHECK_FALSE(Planned(paged_decode(1, 512), window).plan.split.on);
  window.alignment = CausalAlignment::top_left;  // row 0 of a top-left window sees every key after it
  CHECK(Planned(paged_decode(1, 512), window).plan.split.on);
  CHECK(Planned(paged_decode(1, 512, 1, true), SdpaOptions{}).plan.split.lse.present);
  CallOperands with_sinks = paged_decode(1, 512);
  with_sinks.slot[kSinks] = view("sinks", {32}, kF32, kBase + 12 * kMiB);
  const Planned sinks(with_sinks, SdpaOptions{});
  CHECK(sinks.plan.split.on);
  CHECK(sinks.plan.split.sinks == kBase + 12 * kMiB);  // weighed in by the merge ...
  CHECK(sinks.plan.slots[kSinks] == nullptr);          // ... so not by cuDNN
  set_split_kv_enabled(false);
  CHECK_FALSE(Planned(paged_decode(1, 512), SdpaOptions{}).plan.split.on);  // STRIDEDFA_SPLIT_KV unset or off
}

TEST_CASE("decoding by heads with sinks: the graph runs without them and the launch folds them in") {
  const BucketedDecodeGraphs bucketed;
  CallOperands call = decode(3, 300);
  call.slot[kSinks] = view("sinks", {8}, kF32, kBase + 6 * kMiB);
  const Planned p(call, SdpaOptions{});
  REQUIRE(p.plan.ragged.by_heads);
  CHECK(p.plan.slots[kSinks] == nullptr);  // cuDNN's sinks would follow the regrouped heads
  const SinkFold& fold = p.plan.sink_fold;
  REQUIRE(fold.on);
  CHECK(fold.sinks == kBase + 6 * kMiB);
  CHECK(fold.sinks_stride == 1);
  CHECK(fold.out.data == kBase + 3 * kMiB);
  CHECK_FALSE(fold.lse.present);                 // not asked for: the statistics go to the launch's scratch
  CHECK(fold.scratch_bytes() >= 2 * 8 * 3 * 4);  // and the declared padded rows past the last
  const TensorView& stats = *p.plan.slots[kLse];
  CHECK(stats.data == 0);
  CHECK(stats.dtype.bits == 32);
  const RaggedPlan& r = p.plan.ragged;
  CHECK(r.rows[r.row_of[kLse]] == 8 * 3);          // entry i's statistics: (h_q, s_q) packed
  CHECK(r.head_strides[r.row_of[kLse]] == 4 * 3);  // a group of 4 query heads
  CallOperands with_lse = call;
  with_lse.slot[kLse] = view("lse", {2, 8, 3}, kF32, kBase + 5 * kMiB);
  const Planned given(with_lse, SdpaOptions{});
  CHECK(given.plan.sink_fold.lse.data == kBase + 5 * kMiB);  // read, then overwritten, row by row
  CHECK(given.plan.slots[kLse]->data == kBase + 5 * kMiB);
  CHECK(given.plan.sink_fold.scratch_bytes() == 0);
}

TEST_CASE("one query row that sees every key is planned without a mask (cuDNN's fast decoding kernel)") {
  const ExactDecodeGraphs exact;
  SdpaOptions bottom_right;
  bottom_right.causal = true;
  bottom_right.alignment = CausalAlignment::bottom_right;
  CHECK(Planned(decode(1, 300), bottom_right).plan.unmasked);
  CHECK_FALSE(Planned(decode(2, 300), bottom_right).plan.unmasked);  // the first row misses the newest key

  SdpaOptions top_left;
  top_left.causal = true;  // without lengths: the keys are cut to the one the row sees
  const Planned cut(decode(1, 300), top_left);
  CHECK(cut.plan.unmasked);
  CHECK(cut.plan.problem.s_kv == 1);

  SdpaOptions window = bottom_right;
  window.window_left = 31;  // without lengths: cut to the window's 32 keys
  const Planned windowed(decode(1, 300), window);
  CHECK(windowed.plan.unmasked);
  CHECK(windowed.plan.problem.s_kv == 32);

  // With padding lengths nothing is cut on the host: only a mask that leaves the row every real key goes.
  const bool split_before = split_kv_enabled();
  set_split_kv_enabled(false);
  CHECK(Planned(paged_decode(1, 512), bottom_right).plan.unmasked);
  CHECK(Planned(paged_decode(1, 512), SdpaOptions{}).plan.unmasked);
  CHECK_FALSE(Planned(paged_decode(1, 512), top_left).plan.unmasked);
  CHECK_FALSE(Planned(paged_decode(1, 512), window).plan.unmasked);
  set_split_kv_enabled(split_before);
  CallOperands alibi = decode(1, 300);
  alibi.slot[kAlibiSlopes] = view("alibi_slopes", {8}, kF32, kBase + 12 * kMiB);
  CHECK_FALSE(Planned(alibi, bottom_right).plan.unmasked);  // its distances follow the alignment
}

TEST_CASE("decoding by heads through a paged view: one-token blocks of a head-major cache, a table made at launch") {
  const BucketedDecodeGraphs bucketed;
  set_decode_heads_paged(true);  // the default; the fixture chose the ragged form
  SdpaOptions options;
  options.causal = true;
  options.alignment = CausalAlignment::bottom_right;
  const Planned p(decode(1, 300), options);  // q (2, 8, 1, 64), cache (2, 2, 300, 64) head-major
  REQUIRE(p.plan.heads_table.on);
  CHECK_FALSE(p.plan.ragged.on);
  CHECK(p.plan.unmasked);
  CHECK(p.plan.problem.paged);
  CHECK(p.plan.problem.b == 4);    // (batch entry, kv head) sequences
  CHECK(p.plan.problem.h_q == 4);  // the group's query heads
  CHECK(p.plan.problem.h_kv == 1);
  CHECK(p.plan.problem.s_kv == 512);  // the keys' extent: a power of two
  const HeadsTable& t = p.plan.heads_table;
  CHECK(t.rows == 4);
  CHECK(t.width == 512);
  CHECK(t.batch_rows == 600);  // a batch entry: 2 heads x 300 rows
  CHECK(t.head_rows == 300);
  CHECK(t.length == 300);
  CHECK(t.num_blocks == 1200);  // entry 1's head 1 ends at row 1199
  const TensorView& k = *p.plan.slots[kK];
  CHECK(k.dims[0] == 2048);  // the rows the ids may reach, a power of two
  CHECK(k.dims[2] == 1);     // blocks of one token
  CHECK(k.strides[0] == 64);
  CHECK(k.data == p.operands.slots[kK]->data);
  const TensorView& q = *p.plan.slots[kQ];
  CHECK(q.dims[0] == 4);
  CHECK(q.dims[1] == 4);
  CHECK(q.strides[0] == 4 * q.strides[1]);
  CHECK(p.plan.slots[kBlockTable]->dims[2] == 512);
  CHECK(p.plan.made_lengths[1] == 300);
  CHECK(p.plan.slots[kSeqLensKV]->dims[0] == 4);  // one length per sequence (the launch fills the plan's batch)
  CHECK(p.plan.slots[kSeqLensQ]->dims[0] == 4);

  // Nothing in what the graph is built from follows the cache's length within a doubling.
  const Planned longer(decode(1, 301), options);
  CHECK(declared(longer.plan) == declared(p.plan));
  // A token-major cache (a head one element, not whole rows, from the next) keeps the ragged form.
  CHECK_FALSE(Planned(decode(1, 300, false), options).plan.heads_table.on);
  // Several queries keep the ragged form, and so do masks that cut the one row's keys.
  CHECK_FALSE(Planned(decode(2, 300), options).plan.heads_table.on);
  SdpaOptions window = options;
  window.window_left = 63;
  CHECK_FALSE(Planned(decode(1, 300), window).plan.heads_table.on);
  // A window as wide as the cache cuts none of the row's keys (a sliding-window model inside its
  // window): the paged view, unmasked, with the same graph as the full-attention layer's.
  window.window_left = 299;
  const Planned wide(decode(1, 300), window);
  CHECK(wide.plan.heads_table.on);
  CHECK(wide.plan.unmasked);
  CHECK(declared(wide.plan) == declared(p.plan));
  window.window_left = 298;
  CHECK_FALSE(Planned(decode(1, 300), window).plan.heads_table.on);
  SdpaOptions top_left;
  top_left.causal = true;
  CHECK_FALSE(Planned(decode(1, 300), top_left).plan.heads_table.on);
  CHECK(Planned(decode(1, 300), SdpaOptions{}).plan.heads_table.on);
  set_decode_heads_paged(false);
  CHECK_FALSE(Planned(decode(1, 300), options).plan.heads_table.on);
}
