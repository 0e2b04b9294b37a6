// Orchestration of one call: validate -> describe the graph -> cache lookup (build on miss) ->
// execute on the caller's stream.
#include "stridedfa/sdpa.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "stridedfa/cudnn_graphs.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/graph_cache.hpp"
#include "stridedfa/memops.hpp"
#include "stridedfa/runtime.hpp"

namespace stridedfa {
namespace {

// cuDNN never steps along an extent-1 axis, so its stride carries no information: each gets the
// stride a packed tensor would have there (the extent times the stride of the next axis that has
// extent > 1, or 1 when none follows). Calls that differ only on extent-1 axes then share one
// graph, and a tensor that is packed on its other axes is described exactly as packed -- which
// cuDNN demands of some operands by version (the backward's statistics below 9.26), also when
// h or s is 1.
OperandDesc describe_operand(const TensorView& t) {
  OperandDesc d;
  d.present = t.present;
  if (!t.present) return d;
  int64_t inner = 1;  // the packed stride of the axis being filled, from the innermost outwards
  for (int i = 3; i >= 0; --i) {
    d.dims[i] = t.dims[i];
    if (t.dims[i] != 1) {
      d.strides[i] = t.strides[i];
      inner = t.strides[i] * t.dims[i];
    } else {
      d.strides[i] = inner;
    }
  }
  return d;
}

std::string strides_of(const OperandDesc& d, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d.strides[i]);
  return s + ")";
}

// Layouts cuDNN reads correctly only from some version on: refused here, with the layout that
// works, instead of by the frontend (or, before its checks existed, by wrong numbers).
void check_version_gates(const GraphSpec& spec) {
  const OperandDesc& lse = spec.operands[kLse];
  if (!lse.present) return;
  const bool backward = spec.op == GraphOp::backward;
  const int64_t since = backward ? 92600 : 91200;
  if (spec.cudnn_version >= since) return;
  const int64_t h = lse.dims[1], s = lse.dims[2];
  const bool packed = lse.strides[0] == h * s && lse.strides[1] == s && lse.strides[2] == 1;
  if (packed) return;
  throw UnsupportedError(
      std::string("lse: cuDNN ") + std::to_string(spec.cudnn_version / 10000) + "." +
      std::to_string(spec.cudnn_version / 100 % 100) + " " + (backward ? "reads" : "writes") +
      " the softmax statistics " + (backward ? "of the backward " : "") + "only as a packed float32 (batch, heads, " +
      "seq) tensor (cuDNN " + (backward ? "9.26" : "9.12") + " lifts this); lse has strides " + strides_of(lse, 3) +
      " for shape (" + std::to_string(lse.dims[0]) + ", " + std::to_string(h) + ", " + std::to_string(s) +
      "), the packed layout is (" + std::to_string(h * s) + ", " + std::to_string(s) +
      ", 1). Pass a contiguous lse (e.g. lse.contiguous()), or let stridedfa allocate it.");
}

bool is_packed_stats(const TensorView& lse) {
  const int64_t h = lse.dims[1], s = lse.dims[2];
  return (lse.dims[0] == 1 || lse.strides[0] == h * s) && (h == 1 || lse.strides[1] == s) &&
         (s == 1 || lse.strides[2] == 1);
}

// What a call hands cuDNN once the mask's empty rows and keys are cut off (visibility.hpp): the
// operands as views of the caller's tensors, the fills for the regions cut off, and whether the
// statistics must be staged packed.
struct Plan {
  Problem problem;  // the sub-problem cuDNN computes
  TensorView views[kNumSlots];
  const TensorView* slots[kNumSlots] = {};
  int n_fills = 0;
  Fill fills[kMaxFills];
  int n_copies = 0;
  Copy copies[kMaxCopies];
  bool stage_lse = false;
  TensorView lse_source;
  bool nothing_for_cudnn = false;
  // Padding lengths the core makes itself (full extents, filled on the device at launch): the side
  // a caller left out, or both where cuDNN runs a window with s_q > s_kv only in padding mode.
  int64_t made_lengths[2] = {-1, -1};  // value for seqlens_q, seqlens_kv; -1: not made
  bool unmasked = false;               // the sub-problem needs no mask (every pair takes part)
};

// A (b, 1, 1, 1) int32 lengths operand whose memory the launch provides.
TensorView made_lengths_view(const char* name, const Problem& p) {
  TensorView t;
  t.name = name;
  t.present = true;
  t.ndim = 4;
  t.dims[0] = p.b;
  for (int i = 1; i < 4; ++i) t.dims[i] = 1;
  for (int i = 0; i < 4; ++i) t.strides[i] = 1;
  t.dtype = {kDLInt, 32, 1};
  t.device_type = kDLCUDA;
  t.device_id = p.device;
  return t;
}

void make_lengths(Plan& plan, int slot, int64_t value) {
  plan.made_lengths[slot - kSeqLensQ] = value;
  plan.views[slot] = made_lengths_view(kOperands[slot].name, plan.problem);
  plan.slots[slot] = &plan.views[slot];
}

void add_fill(Plan& plan, const TensorView& region, int slot) {
  if (region.numel() == 0) return;
  plan.fills[plan.n_fills++] = {region, kOperands[slot].kind == OperandKind::stats ? kNegativeInfinityBits : 0u};
}

void restrict_to(GraphOp op, const Visibility& seen, const TensorView* const* operands, int64_t cudnn_version,
                 Plan& plan);

// cuDNN's backward refuses s_q = s_kv = 1, whose gradients are exact without it: one key gets all
// the weight (P = 1 whatever the scores), so dQ = dK = 0 and dV = dO. With grouped heads dV sums
// dO over each group: the g query heads sharing a kv head are then described as g query rows of
// one head (a view: their seq axis is the heads' stride), which cuDNN's backward runs.
void one_query_one_key_backward(Plan& plan) {
  Problem& p = plan.problem;
  if (plan.slots[kSinks]) {
    throw UnsupportedError(
        "the backward with s_q = s_kv = 1 and attention sinks is not supported (cuDNN refuses "
        "s_q = s_kv = 1 with a sink token).");
  }
  if (p.h_q == p.h_kv) {
    plan.nothing_for_cudnn = true;
    add_fill(plan, plan.views[kGradQ], kGradQ);
    add_fill(plan, plan.views[kGradK], kGradK);
    plan.copies[plan.n_copies++] = {plan.views[kGradO], plan.views[kGradV]};
    return;
  }
  const int64_t group = p.h_q / p.h_kv;
  for (int s = 0; s < kNumSlots; ++s) {
    if (!plan.slots[s] || kOperands[s].shape[1] != kHeadsQ) continue;
    TensorView& t = plan.views[s];
    t.strides[2] = t.strides[1];
    t.strides[1] *= group;
    t.dims[1] = p.h_kv;
    t.dims[2] = group;
  }
  p.h_q = p.h_kv;
  p.s_q = group;
  plan.unmasked = true;  // every row of the fold sees the one key, whatever the mask said
}

void plan_call(GraphOp op, const Problem& problem, const SdpaOptions& options, const TensorView* const* operands,
               int64_t cudnn_version, Plan& plan) {
  plan.problem = problem;
  const bool has_lengths = operands[kSeqLensQ] || operands[kSeqLensKV];
  const Visibility seen = visible_region(options, problem, has_lengths);
  for (int s = 0; s < kNumSlots; ++s) {
    if (!operands[s]) continue;
    plan.views[s] = *operands[s];
    plan.slots[s] = &plan.views[s];
  }
  if (problem.nothing_to_do) return;
  if (has_lengths) {
    // Padded rows are not written by cuDNN's forward: their statistics get -inf first.
    if (op == GraphOp::forward && operands[kLse]) add_fill(plan, *operands[kLse], kLse);
    if (!operands[kSeqLensQ]) make_lengths(plan, kSeqLensQ, problem.s_q);
    if (!operands[kSeqLensKV]) make_lengths(plan, kSeqLensKV, problem.s_kv);
    return;
  }
  if (seen.restricts(problem)) {
    const bool rows_cut = seen.row_begin != 0 || seen.row_end != problem.s_q;
    if (operands[kSinks] && rows_cut) {
      throw UnsupportedError("attention sinks with rows that see no key (" +
                             std::to_string(problem.s_q - (seen.row_end - seen.row_begin)) + " of " +
                             std::to_string(problem.s_q) +
                             " rows under this mask) are not supported: such a row's statistics " +
                             "would be its head's sink value, which stridedfa cannot write without a kernel; use a "
                             "mask under which every " +
                             "row sees a key (e.g. s_q <= s_kv with bottom-right alignment).");
    }
    restrict_to(op, seen, operands, cudnn_version, plan);
  }
  if (op == GraphOp::backward && !plan.nothing_for_cudnn && plan.problem.s_q == 1 && plan.problem.s_kv == 1) {
    one_query_one_key_backward(plan);
    return;
  }
  // cuDNN runs a left bound, or a bottom-right right bound, with s_q > s_kv only in padding mode.
  const bool banded =
      options.left_bound() != SdpaOptions::kUnbounded ||
      (options.alignment == CausalAlignment::bottom_right && options.right_bound() != SdpaOptions::kUnbounded);
  if (!plan.nothing_for_cudnn && banded && plan.problem.s_q > plan.problem.s_kv) {
    make_lengths(plan, kSeqLensQ, plan.problem.s_q);
    make_lengths(plan, kSeqLensKV, plan.problem.s_kv);
  }
}

// Describes only the rows and keys in `seen` and fills the outputs' regions outside it.
void restrict_to(GraphOp op, const Visibility& seen, const TensorView* const* operands, int64_t cudnn_version,
                 Plan& plan) {
  plan.problem.s_q = std::max<int64_t>(seen.row_end - seen.row_begin, 0);
  plan.problem.s_kv = std::max<int64_t>(seen.key_end - seen.key_begin, 0);
  plan.nothing_for_cudnn = seen.empty();
  for (int s = 0; s < kNumSlots; ++s) {
    const OperandKind kind = kOperands[s].kind;
    if (!operands[s] || (kind != OperandKind::attention && kind != OperandKind::stats)) continue;
    const Extent seq = kOperands[s].shape[2];
    const int64_t begin = seq == kSeqQ ? seen.row_begin : seen.key_begin;
    const int64_t end = seq == kSeqQ ? seen.row_end : seen.key_end;
    const int64_t extent = operands[s]->dims[2];
    const int64_t b = std::min(begin, extent), e = std::clamp(end, b, extent);
    if (role_in(op, s) == Role::output) {
      add_fill(plan, seq_slice(*operands[s], 0, b), s);
      add_fill(plan, seq_slice(*operands[s], e, extent), s);
    }
    plan.views[s] = seq_slice(*operands[s], b, e);
  }
  // A row slice of the caller's statistics may be misaligned (rows of 4 bytes) or, before cuDNN
  // 9.12 (forward) / 9.26 (backward), not packed enough for cuDNN: it then goes through a packed,
  // aligned staging buffer (copied in before a backward, out after a forward).
  if (!operands[kLse] || plan.views[kLse].dims[2] == operands[kLse]->dims[2]) return;
  const TensorView& sliced = plan.views[kLse];
  const int64_t packed_since = op == GraphOp::backward ? 92600 : 91200;
  const bool old_cudnn_needs_packed = cudnn_version < packed_since && !is_packed_stats(sliced);
  if (sliced.data % 16 == 0 && !old_cudnn_needs_packed) return;
  plan.stage_lse = true;
  plan.lse_source = sliced;
  TensorView& staged = plan.views[kLse];  // described packed; its pointer is set at launch
  staged.strides[0] = staged.dims[1] * staged.dims[2];
  staged.strides[1] = staged.dims[2];
  staged.strides[2] = 1;
  staged.strides[3] = 1;
  staged.data = 0;
}

GraphSpec spec_for(GraphOp op, const Plan& plan, const SdpaOptions& o, int32_t sm_version, int64_t cudnn_version) {
  const Problem& p = plan.problem;
  GraphSpec spec;
  spec.op = op;
  spec.dtype = p.dtype;
  for (int s = 0; s < kNumSlots; ++s) {
    if (plan.slots[s]) spec.operands[s] = describe_operand(*plan.slots[s]);
  }
  spec.scale = static_cast<float>(o.has_scale ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.d_qk)));
  spec.causal = o.causal && !plan.unmasked;
  spec.alignment = o.alignment;
  spec.left_bound = plan.unmasked ? SdpaOptions::kUnbounded : o.left_bound();
  spec.right_bound = plan.unmasked ? SdpaOptions::kUnbounded : o.right_bound();
  spec.deterministic = op == GraphOp::backward && o.deterministic;
  spec.softcap = static_cast<float>(o.softcap);
  spec.device = p.device;
  spec.sm_version = sm_version;
  spec.cudnn_version = cudnn_version;
  check_version_gates(spec);
  return spec;
}

PreparedCall prepare(GraphOp op, const Problem& problem, const SdpaOptions& options,
                     const TensorView* const* operands) {
  PreparedCall call;
  call.problem = problem;
  if (problem.nothing_to_do) {  // only a sinks' gradient can have elements: it is zero
    if (operands[kGradSinks] && operands[kGradSinks]->numel() != 0) {
      call.fills[call.n_fills++] = {*operands[kGradSinks], 0u};
    }
    return call;
  }
  if (!libraries_loaded()) {
    throw BackendError("cuDNN is not loaded; stridedfa loads it on the first GPU call (see stridedfa.info())");
  }
  const int64_t cudnn_version = cudnn_runtime_version();
  Plan plan;
  plan_call(op, problem, options, operands, cudnn_version, plan);
  call.n_fills = plan.n_fills;
  std::copy(plan.fills, plan.fills + plan.n_fills, call.fills);
  call.n_copies = plan.n_copies;
  std::copy(plan.copies, plan.copies + plan.n_copies, call.copies);
  if (plan.nothing_for_cudnn) return call;
  const GraphSpec spec = spec_for(op, plan, options, device_info(problem.device).sm_version, cudnn_version);
  // A training or decoding loop repeats its last configuration: each thread remembers its last
  // lookup, and a repeat redeems a ticket instead of hashing and comparing a key in the cache.
  thread_local struct {
    int64_t key[GraphSpec::kMaxKeyLength];
    int length = 0;
    GraphCache::Ticket ticket;
  } last;
  int64_t key[GraphSpec::kMaxKeyLength];
  const int length = spec.write_key(key);
  if (length == last.length && std::memcmp(key, last.key, sizeof(int64_t) * size_t(length)) == 0) {
    call.graph = graph_cache().redeem(last.ticket);
  }
  if (!call.graph) {
    last.length = 0;  // until the lookup below succeeds
    call.graph = graph_cache().get_or_build(
        std::vector<int64_t>(key, key + length),
        [&] {
          DeviceGuard guard(spec.device);
          return build_graph(spec, cudnn_handle_for(spec.device, 0));
        },
        &last.ticket);
    std::memcpy(last.key, key, sizeof(int64_t) * size_t(length));
    last.length = length;
  }
  call.workspace_bytes = call.graph->workspace_bytes;
  call.n_ptrs = static_cast<int>(call.graph->operand_order.size());
  for (int i = 0; i < call.n_ptrs; ++i) {
    const Slot slot = call.graph->operand_order[size_t(i)];
    call.ptrs[i] = reinterpret_cast<void*>(plan.slots[slot]->data);
    if (slot == kLse && plan.stage_lse) {
      call.staged_lse_ptr = i;
      call.staged_lse_source = plan.lse_source;
      call.staged_lse_output = op == GraphOp::forward;
    }
    if ((slot == kSeqLensQ || slot == kSeqLensKV) && plan.made_lengths[slot - kSeqLensQ] >= 0) {
      call.made_lengths_ptr[slot - kSeqLensQ] = i;
      call.made_lengths_value[slot - kSeqLensQ] = plan.made_lengths[slot - kSeqLensQ];
    }
  }
  return call;
}

}  // namespace

int GraphSpec::write_key(int64_t* out) const {
  int n = 0;
  out[n++] = static_cast<int64_t>(op);
  out[n++] = int64_t(dtype.code) | int64_t(dtype.bits) << 8 | int64_t(dtype.lanes) << 16;
  for (const OperandDesc& d : operands) {
    out[n++] = d.present;
    if (!d.present) continue;
    for (int i = 0; i < 4; ++i) out[n++] = d.dims[i];
    for (int i = 0; i < 4; ++i) out[n++] = d.strides[i];
  }
  int32_t scale_bits;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  out[n++] = scale_bits;
  out[n++] = causal;
  out[n++] = static_cast<int64_t>(alignment);
  out[n++] = left_bound;
  out[n++] = right_bound;
  out[n++] = deterministic;
  int32_t softcap_bits;
  std::memcpy(&softcap_bits, &softcap, sizeof softcap_bits);
  out[n++] = softcap_bits;
  out[n++] = device;
  out[n++] = sm_version;
  out[n++] = cudnn_version;
  return n;
}

std::vector<int64_t> GraphSpec::key() const {
  int64_t k[kMaxKeyLength];
  return std::vector<int64_t>(k, k + write_key(k));
}

namespace {

// The operands of a call in slot order (absent ones null), each as its 4-axis view.
struct Operands {
  TensorView views[kNumSlots];
  const TensorView* slots[kNumSlots] = {};

  explicit Operands(const SlotViews& given) {
    for (int s = 0; s < kNumSlots; ++s) {
      if (!given[s] || !given[s]->present) continue;
      views[s] = as_4d(*given[s], kOperands[s].kind);
      slots[s] = &views[s];
    }
  }
  Operands(const Operands&) = delete;  // slots point into this object
  Operands& operator=(const Operands&) = delete;
};

std::vector<int64_t> graph_key(GraphOp op, const Problem& problem, const SdpaOptions& options, const Operands& operands,
                               int32_t sm_version, int64_t cudnn_version) {
  Plan plan;
  plan_call(op, problem, options, operands.slots, cudnn_version, plan);
  if (problem.nothing_to_do || plan.nothing_for_cudnn) return {};
  return spec_for(op, plan, options, sm_version, cudnn_version).key();
}

}  // namespace

PreparedCall prepare_forward(const ForwardArgs& a, const SdpaOptions& options) {
  const Problem problem = validate_forward(a);
  validate_options(options, problem);
  return prepare(GraphOp::forward, problem, options, Operands(a.slots()).slots);
}

PreparedCall prepare_backward(const BackwardArgs& a, const SdpaOptions& options) {
  const Problem problem = validate_backward(a);
  validate_options(options, problem);
  return prepare(GraphOp::backward, problem, options, Operands(a.slots()).slots);
}

std::vector<int64_t> forward_graph_key(const ForwardArgs& a, const SdpaOptions& options, int32_t sm_version,
                                       int64_t cudnn_version) {
  const Problem problem = validate_forward(a);
  validate_options(options, problem);
  return graph_key(GraphOp::forward, problem, options, Operands(a.slots()), sm_version, cudnn_version);
}

std::vector<int64_t> backward_graph_key(const BackwardArgs& a, const SdpaOptions& options, int32_t sm_version,
                                        int64_t cudnn_version) {
  const Problem problem = validate_backward(a);
  validate_options(options, problem);
  return graph_key(GraphOp::backward, problem, options, Operands(a.slots()), sm_version, cudnn_version);
}

namespace {
std::atomic<int64_t> own_workspace_count{0};
}  // namespace

int64_t own_workspace_allocations() { return own_workspace_count.load(std::memory_order_relaxed); }

void execute(const PreparedCall& call, std::uintptr_t stream, void* workspace) {
  if (call.problem.nothing_to_do && call.n_fills == 0) return;
  DeviceGuard guard(call.problem.device);
  for (int i = 0; i < call.n_fills; ++i) fill_strided(call.fills[i].region, call.fills[i].pattern, stream);
  for (int i = 0; i < call.n_copies; ++i) copy_strided(call.copies[i].from, call.copies[i].to, stream);
  if (!call.graph) return;
  void* handle = cudnn_handle_for(call.problem.device, stream);
  void* pooled = nullptr;
  void* staged = nullptr;
  void* lengths = nullptr;
  void* ptrs[kNumSlots];
  std::copy(call.ptrs, call.ptrs + call.n_ptrs, ptrs);
  try {
    if (call.made_lengths_ptr[0] >= 0 || call.made_lengths_ptr[1] >= 0) {
      const int64_t b = call.problem.b;
      lengths = pool_alloc(call.problem.device, 2 * b * int64_t(sizeof(int32_t)), stream);
      for (int side = 0; side < 2; ++side) {
        if (call.made_lengths_ptr[side] < 0) continue;
        TensorView region;
        region.present = true;
        region.ndim = 1;
        region.dims[0] = b;
        region.strides[0] = 1;
        region.dtype = {kDLInt, 32, 1};
        region.data = reinterpret_cast<std::uintptr_t>(lengths) + std::uintptr_t(side * b * 4);
        fill_strided(region, static_cast<uint32_t>(call.made_lengths_value[side]), stream);
        ptrs[call.made_lengths_ptr[side]] = reinterpret_cast<void*>(region.data);
      }
    }
    if (call.workspace_bytes > 0 && workspace == nullptr) {
      workspace = pooled = pool_alloc(call.problem.device, call.workspace_bytes, stream);
      own_workspace_count.fetch_add(1, std::memory_order_relaxed);
    }
    const bool forward = call.staged_lse_output;
    if (call.staged_lse_ptr >= 0) {
      const TensorView& user = call.staged_lse_source;
      staged = pool_alloc(call.problem.device, user.numel() * user.itemsize(), stream);
      if (!forward) copy_to_packed(user, staged, stream);
      ptrs[call.staged_lse_ptr] = staged;
    }
    call.graph->execute(handle, ptrs, workspace);
    if (call.staged_lse_ptr >= 0 && forward) {
      TensorView packed = call.staged_lse_source;
      int64_t step = 1;
      for (int i = packed.ndim - 1; i >= 0; --i) {
        packed.strides[i] = step;
        step *= packed.dims[i];
      }
      packed.data = reinterpret_cast<std::uintptr_t>(staged);
      copy_strided(packed, call.staged_lse_source, stream);
    }
  } catch (...) {
    if (pooled) pool_free(pooled, stream);
    if (staged) pool_free(staged, stream);
    if (lengths) pool_free(lengths, stream);
    throw;
  }
  if (pooled) pool_free(pooled, stream);
  if (staged) pool_free(staged, stream);
  if (lengths) pool_free(lengths, stream);
}

}  // namespace stridedfa
