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

GraphSpec spec_for(GraphOp op, const Problem& p, const SdpaOptions& o, const TensorView* const* operands,
                   int32_t sm_version, int64_t cudnn_version) {
  GraphSpec spec;
  spec.op = op;
  spec.dtype = p.dtype;
  for (int s = 0; s < kNumSlots; ++s) {
    if (operands[s]) spec.operands[s] = describe_operand(*operands[s]);
  }
  spec.scale = static_cast<float>(o.has_scale ? o.scale : 1.0 / std::sqrt(static_cast<double>(p.d_qk)));
  spec.causal = o.causal;
  spec.alignment = o.alignment;
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
  if (problem.nothing_to_do) return call;
  if (!libraries_loaded()) {
    throw BackendError("cuDNN is not loaded; stridedfa loads it on the first GPU call (see stridedfa.info())");
  }
  const GraphSpec spec =
      spec_for(op, problem, options, operands, device_info(problem.device).sm_version, cudnn_runtime_version());
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
    call.ptrs[i] = reinterpret_cast<void*>(operands[call.graph->operand_order[size_t(i)]]->data);
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
  out[n++] = device;
  out[n++] = sm_version;
  out[n++] = cudnn_version;
  return n;
}

std::vector<int64_t> GraphSpec::key() const {
  int64_t k[kMaxKeyLength];
  return std::vector<int64_t>(k, k + write_key(k));
}

// The operands of a call in slot order (absent ones null); the statistics as their 4-axis view.
struct Operands {
  TensorView lse;
  const TensorView* slots[kNumSlots] = {};

  explicit Operands(const ForwardArgs& a) : lse(stats_as_4d(a.lse)) {
    const TensorView* s[] = {&a.q, &a.k, &a.v, &a.out, a.lse.present ? &lse : nullptr};
    std::copy(std::begin(s), std::end(s), slots);
  }
  explicit Operands(const BackwardArgs& a) : lse(stats_as_4d(a.lse)) {
    const TensorView* s[] = {&a.q, &a.k, &a.v, &a.out, &lse, &a.grad_out, &a.grad_q, &a.grad_k, &a.grad_v};
    std::copy(std::begin(s), std::end(s), slots);
  }
  Operands(const Operands&) = delete;  // slots point into this object
  Operands& operator=(const Operands&) = delete;
};

PreparedCall prepare_forward(const ForwardArgs& a, const SdpaOptions& options) {
  const Problem problem = validate_forward(a);
  validate_options(options, problem);
  return prepare(GraphOp::forward, problem, options, Operands(a).slots);
}

PreparedCall prepare_backward(const BackwardArgs& a, const SdpaOptions& options) {
  const Problem problem = validate_backward(a);
  validate_options(options, problem);
  return prepare(GraphOp::backward, problem, options, Operands(a).slots);
}

std::vector<int64_t> forward_graph_key(const ForwardArgs& a, const SdpaOptions& options, int32_t sm_version,
                                       int64_t cudnn_version) {
  const Problem problem = validate_forward(a);
  validate_options(options, problem);
  return spec_for(GraphOp::forward, problem, options, Operands(a).slots, sm_version, cudnn_version).key();
}

std::vector<int64_t> backward_graph_key(const BackwardArgs& a, const SdpaOptions& options, int32_t sm_version,
                                        int64_t cudnn_version) {
  const Problem problem = validate_backward(a);
  validate_options(options, problem);
  return spec_for(GraphOp::backward, problem, options, Operands(a).slots, sm_version, cudnn_version).key();
}

namespace {
std::atomic<int64_t> own_workspace_count{0};
}  // namespace

int64_t own_workspace_allocations() { return own_workspace_count.load(std::memory_order_relaxed); }

void execute(const PreparedCall& call, std::uintptr_t stream, void* workspace) {
  if (call.problem.nothing_to_do) return;
  DeviceGuard guard(call.problem.device);
  void* handle = cudnn_handle_for(call.problem.device, stream);
  void* pooled = nullptr;
  if (call.workspace_bytes > 0 && workspace == nullptr) {
    workspace = pooled = pool_alloc(call.problem.device, call.workspace_bytes, stream);
    own_workspace_count.fetch_add(1, std::memory_order_relaxed);
  }
  try {
    call.graph->execute(handle, call.ptrs, workspace);
  } catch (...) {
    if (pooled) pool_free(pooled, stream);
    throw;
  }
  if (pooled) pool_free(pooled, stream);
}

}  // namespace stridedfa
