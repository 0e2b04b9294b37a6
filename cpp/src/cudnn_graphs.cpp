// The only translation unit that includes cudnn_frontend.h: builds SDPA forward and backward
// graphs from a GraphSpec, giving cuDNN the real dims and strides of every operand, and executes
// them with the sorted-pointer overload (no per-call maps). Compiled with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: the frontend reaches cuDNN through cudnn_dlhandle below.
#include <cudnn_frontend.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "stridedfa/cudnn_graphs.hpp"
#include "stridedfa/errors.hpp"

namespace cudnn_frontend {
// The frontend declares this handle and resolves every cuDNN symbol through it; it must be set
// before the first frontend call (symbol pointers are cached in function statics).
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace stridedfa {
namespace {

namespace fe = cudnn_frontend;
using fe::graph::Tensor_attributes;

int64_t uid_of(Slot slot) { return int64_t(slot) + 1; }

fe::DataType_t io_type(DLDataType dtype) {
  return dtype.code == kDLBfloat ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

const char* slot_name(Slot slot) { return kOperands[slot].name; }

Tensor_attributes describe(const GraphSpec& spec, Slot slot) {
  const OperandDesc& d = spec.operands[slot];
  auto t = Tensor_attributes()
               .set_name(slot_name(slot))
               .set_uid(uid_of(slot))
               .set_dim({d.dims[0], d.dims[1], d.dims[2], d.dims[3]})
               .set_stride({d.strides[0], d.strides[1], d.strides[2], d.strides[3]});
  if (kOperands[slot].kind == OperandKind::stats || kOperands[slot].kind == OperandKind::per_head ||
      kOperands[slot].kind == OperandKind::fp8_scale) {
    t.set_data_type(fe::DataType_t::FLOAT);
  }
  const OperandKind kind = kOperands[slot].kind;
  if (kind == OperandKind::lengths || kind == OperandKind::page_table) t.set_data_type(fe::DataType_t::INT32);
  return t;
}

bool on_token_axis(Slot slot) {
  return kOperands[slot].kind == OperandKind::attention || kOperands[slot].kind == OperandKind::stats;
}

// A variable-length call's operand starts each sequence at its ragged offset: (sequences + 1)
// int32 element offsets, made on the device at launch.
void set_ragged(fe::graph::Graph& graph, Tensor_attributes& t, const GraphSpec& spec, Slot slot) {
  if (!spec.ragged || !on_token_axis(slot)) return;
  const int64_t entries = spec.operands[kQ].dims[0] + 1;
  t.set_ragged_offset(graph.tensor(Tensor_attributes()
                                       .set_name(std::string(slot_name(slot)) + "_ragged_offsets")
                                       .set_uid(int64_t(kRaggedOffsetTensor) + slot + 1)
                                       .set_dim({entries, 1, 1, 1})
                                       .set_stride({1, 1, 1, 1})
                                       .set_data_type(fe::DataType_t::INT32)));
}

// An input operand of the graph, with its ragged offsets where the call has them.
std::shared_ptr<Tensor_attributes> input(fe::graph::Graph& graph, const GraphSpec& spec, Slot slot) {
  auto t = graph.tensor(describe(spec, slot));
  set_ragged(graph, *t, spec, slot);
  return t;
}

// The Philox seed and offset: the two int64 values of rng_state, each a (1, 1, 1, 1) tensor.
std::pair<std::shared_ptr<Tensor_attributes>, std::shared_ptr<Tensor_attributes>> philox_tensors(
    fe::graph::Graph& graph) {
  auto scalar = [&](int64_t uid, const char* name) {
    return graph.tensor(Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({1, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT64));
  };
  return {scalar(uid_of(kRngState), "dropout_seed"), scalar(int64_t(kRngOffsetTensor) + 1, "dropout_offset")};
}

template <class Attributes>
void set_dropout(fe::graph::Graph& graph, Attributes& attributes, const GraphSpec& spec) {
  if (!(spec.dropout_p > 0) || !spec.operands[kRngState].present) return;
  auto [seed, offset] = philox_tensors(graph);
  attributes.set_dropout(spec.dropout_p, seed, offset);
}

void mark_output(fe::graph::Graph& graph, const std::shared_ptr<Tensor_attributes>& t, const GraphSpec& spec,
                 Slot slot) {
  const OperandDesc& d = spec.operands[slot];
  set_ragged(graph, *t, spec, slot);
  t->set_output(true)
      .set_name(slot_name(slot))
      .set_uid(uid_of(slot))
      .set_dim({d.dims[0], d.dims[1], d.dims[2], d.dims[3]})
      .set_stride({d.strides[0], d.strides[1], d.strides[2], d.strides[3]});
  if (kOperands[slot].kind == OperandKind::stats) t->set_data_type(fe::DataType_t::FLOAT);
}

fe::DiagonalAlignment_t diagonal(CausalAlignment a) {
  return a == CausalAlignment::bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT;
}

// Support-check failures become UnsupportedError (the configuration cannot run); failures of cuDNN
// or CUDA themselves become BackendError.
void check(fe::error_t status, const char* stage) {
  if (status.is_good()) return;
  const std::string message = std::string("cuDNN ") + stage + ": " + status.get_message();
  switch (status.get_code()) {
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
    case fe::error_code_t::INVALID_VALUE:
      throw UnsupportedError(message);
    default:
      throw BackendError(message);
  }
}

class FrontendGraph final : public BuiltGraph {
 public:
  explicit FrontendGraph(std::shared_ptr<fe::graph::Graph> graph) : graph_(std::move(graph)) {}

  void execute(void* cudnn_handle, void* const* ptrs, void* workspace) const override {
    auto status = graph_->execute(static_cast<cudnnHandle_t>(cudnn_handle), const_cast<void**>(ptrs),
                                  static_cast<int>(operand_order.size()), workspace);
    if (!status.is_good()) throw BackendError("cuDNN execute: " + status.get_message());
  }

  std::vector<uint8_t> serialize() const override {
    std::vector<uint8_t> plan;
    try {
      // The plan alone: a loaded graph is executed by UID, never rebuilt from its structure.
      check(graph_->serialize(plan, false), "could not serialize the plan");
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // cuDNN's own exceptions (the plan's JSON), the JSON library's
      throw BackendError(std::string("cudnn-frontend: could not serialize the plan: ") + e.what());
    }
    return plan;
  }

 private:
  std::shared_ptr<fe::graph::Graph> graph_;
};

std::shared_ptr<fe::graph::Graph> new_graph(const GraphSpec& spec) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(io_type(spec.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  graph->set_sm_version(spec.sm_version);  // spares the frontend its own device queries
  return graph;
}

// The mask: a diagonal band (causal is a right bound of 0; FlashAttention's window left w is
// cuDNN's left bound w + 1, which keeps keys j > i - bound) and the padding lengths.
template <class Attributes>
void set_mask(fe::graph::Graph& graph, Attributes& attributes, const GraphSpec& spec) {
  const bool band = spec.left_bound != SdpaOptions::kUnbounded || spec.right_bound != SdpaOptions::kUnbounded;
  if (band) attributes.set_diagonal_alignment(diagonal(spec.alignment));
  if (spec.right_bound != SdpaOptions::kUnbounded) {
    attributes.set_diagonal_band_right_bound(static_cast<int>(spec.right_bound));
  }
  if (spec.left_bound != SdpaOptions::kUnbounded) {
    attributes.set_diagonal_band_left_bound(static_cast<int>(spec.left_bound + 1));
  }
  if (spec.operands[kSeqLensQ].present) {
    attributes.set_padding_mask(true)
        .set_seq_len_q(graph.tensor(describe(spec, kSeqLensQ)))
        .set_seq_len_kv(graph.tensor(describe(spec, kSeqLensKV)));
  }
}

// ALiBi as pointwise nodes: score - slope_h * |i - j + offset|, the indices those of the scores
// cuDNN computes.
std::shared_ptr<Tensor_attributes> add_alibi(const std::shared_ptr<fe::graph::Graph>& sub,
                                             std::shared_ptr<Tensor_attributes> score,
                                             const std::shared_ptr<Tensor_attributes>& slopes, int64_t offset) {
  using fe::graph::Pointwise_attributes;
  using Mode = fe::PointwiseMode_t;
  auto int_op = [&](auto a, auto b, Mode mode, const char* name) {
    auto r = sub->pointwise(
        a, b, Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(fe::DataType_t::INT32));
    r->set_data_type(fe::DataType_t::INT32);
    return r;
  };
  auto index = [&](int64_t axis, const char* name) {
    auto r = sub->pointwise(score, Pointwise_attributes()
                                       .set_name(name)
                                       .set_mode(Mode::GEN_INDEX)
                                       .set_axis(axis)
                                       .set_compute_data_type(fe::DataType_t::INT32));
    r->set_data_type(fe::DataType_t::INT32);
    return r;
  };
  auto distance = int_op(index(2, "alibi_row"), index(3, "alibi_col"), Mode::SUB, "alibi_row_minus_col");
  if (offset != 0) {
    distance =
        int_op(distance, std::make_shared<Tensor_attributes>(static_cast<int32_t>(offset)), Mode::ADD, "alibi_offset");
  }
  auto magnitude = sub->pointwise(
      distance,
      Pointwise_attributes().set_name("alibi_abs").set_mode(Mode::ABS).set_compute_data_type(fe::DataType_t::FLOAT));
  auto term = sub->pointwise(magnitude, slopes, Pointwise_attributes().set_name("alibi_slope").set_mode(Mode::MUL));
  return sub->pointwise(score, term, Pointwise_attributes().set_name("alibi_sub").set_mode(Mode::SUB));
}

// Softcap (scores -> c tanh(scores / c)) and ALiBi are score modifiers, and cuDNN then applies none
// of its built-in masks: the same band and padding masks are built into the modifier after them,
// from cudnn-frontend's own mask subgraphs. The backward recomputes the scores through the same
// modifier and takes the cap's derivative in its bprop (one Softcap object holds what both share);
// ALiBi, a constant added, needs none.
template <class Attributes>
void set_score_modifier(fe::graph::Graph& graph, Attributes& attributes, const GraphSpec& spec,
                        std::shared_ptr<fe::graph::attn::score_modifiers::Softcap> softcap) {
  namespace mods = fe::graph::attn::score_modifiers;
  std::shared_ptr<Tensor_attributes> seq_q, seq_kv, slopes;
  if (spec.operands[kSeqLensQ].present) {
    seq_q = graph.tensor(describe(spec, kSeqLensQ));
    seq_kv = graph.tensor(describe(spec, kSeqLensKV));
    attributes.set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
  }
  if (spec.operands[kAlibiSlopes].present) slopes = graph.tensor(describe(spec, kAlibiSlopes));
  std::optional<int64_t> left, right;
  if (spec.left_bound != SdpaOptions::kUnbounded) left = spec.left_bound + 1;
  if (spec.right_bound != SdpaOptions::kUnbounded) right = spec.right_bound;
  const auto alignment = diagonal(spec.alignment);
  const float cap = spec.softcap;
  const int64_t s_q = spec.operands[kQ].dims[2], s_kv = spec.operands[kK].dims[2];
  const int64_t alibi_offset = spec.alibi_offset;
  attributes.set_score_mod([=](std::shared_ptr<fe::graph::Graph> sub, std::shared_ptr<Tensor_attributes> score) {
    if (softcap) score = softcap->forward(sub, score, std::make_shared<Tensor_attributes>(cap));
    if (slopes) {
      score = add_alibi(sub, score, slopes, alibi_offset);
    }
    if (seq_q) score = mods::padding_mask(sub, score, seq_kv, seq_q);
    if (left || right) {
      score = mods::sliding_window_mask(sub, score, alignment, left, right, s_q, s_kv, seq_q, seq_kv, nullptr, nullptr);
    }
    return score;
  });
}

// A paged KV cache: k and v are (num_blocks, h_kv, block_size, d) containers read through one page
// table each (the same block ids, two tensors), up to blocks x block_size keys per sequence.
void set_paged(fe::graph::Graph& graph, fe::graph::SDPA_attributes& attributes, const GraphSpec& spec) {
  auto v_table = describe(spec, kBlockTable);
  v_table.set_uid(int64_t(kPageTableV) + 1).set_name("page_table_v");
  const int64_t s_kv = spec.operands[kBlockTable].dims[2] * spec.operands[kK].dims[2];
  attributes.set_paged_attention_k_table(graph.tensor(describe(spec, kBlockTable)))
      .set_paged_attention_v_table(graph.tensor(v_table))
      .set_paged_attention_max_seq_len_kv(static_cast<int>(s_kv));
}

void add_forward(fe::graph::Graph& graph, const GraphSpec& spec) {
  auto q = input(graph, spec, kQ);
  auto k = input(graph, spec, kK);
  auto v = input(graph, spec, kV);
  const bool stats = spec.operands[kLse].present;
  auto attributes =
      fe::graph::SDPA_attributes().set_name("sdpa_forward").set_generate_stats(stats).set_attn_scale(spec.scale);
  if (spec.softcap > 0 || spec.operands[kAlibiSlopes].present) {
    set_score_modifier(graph, attributes, spec,
                       spec.softcap > 0 ? std::make_shared<fe::graph::attn::score_modifiers::Softcap>() : nullptr);
  } else {
    set_mask(graph, attributes, spec);
  }
  if (spec.operands[kSinks].present) attributes.set_sink_token(graph.tensor(describe(spec, kSinks)));
  if (spec.operands[kBias].present) attributes.set_bias(graph.tensor(describe(spec, kBias)));
  if (spec.operands[kBlockTable].present) set_paged(graph, attributes, spec);
  set_dropout(graph, attributes, spec);
  if (spec.ragged) attributes.set_max_total_seq_len_q(spec.max_total_q).set_max_total_seq_len_kv(spec.max_total_kv);
  auto [o, lse] = graph.sdpa(q, k, v, attributes);
  mark_output(graph, o, spec, kO);
  if (stats) mark_output(graph, lse, spec, kLse);
}

void add_backward(fe::graph::Graph& graph, const GraphSpec& spec) {
  auto q = input(graph, spec, kQ);
  auto k = input(graph, spec, kK);
  auto v = input(graph, spec, kV);
  auto o = input(graph, spec, kO);
  auto d_o = input(graph, spec, kGradO);
  auto lse = input(graph, spec, kLse);
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(spec.scale);
  if (spec.softcap > 0 || spec.operands[kAlibiSlopes].present) {
    std::shared_ptr<fe::graph::attn::score_modifiers::Softcap> softcap;
    if (spec.softcap > 0) softcap = std::make_shared<fe::graph::attn::score_modifiers::Softcap>();
    set_score_modifier(graph, attributes, spec, softcap);
    const float cap = spec.softcap;
    if (softcap) {
      attributes.set_score_mod_bprop(
          [=](std::shared_ptr<fe::graph::Graph> sub, std::shared_ptr<Tensor_attributes> grad) {
            return softcap->backward(sub, grad, std::make_shared<Tensor_attributes>(cap));
          });
    }
  } else {
    set_mask(graph, attributes, spec);
  }
  if (spec.deterministic) attributes.set_deterministic_algorithm(true);
  if (spec.operands[kSinks].present) attributes.set_sink_token(graph.tensor(describe(spec, kSinks)));
  if (spec.operands[kGradSinks].present) {  // an output the frontend writes by a reduction
    auto grad_sinks = std::make_shared<Tensor_attributes>(describe(spec, kGradSinks));
    grad_sinks->set_output(true);
    attributes.set_dsink_token(grad_sinks);
  }
  if (spec.operands[kBias].present) attributes.set_bias(graph.tensor(describe(spec, kBias)));
  if (spec.operands[kGradBias].present) {  // dP reduced over the bias' broadcast axes
    auto grad_bias = std::make_shared<Tensor_attributes>(describe(spec, kGradBias));
    grad_bias->set_output(true);
    attributes.set_dbias(grad_bias);
  }
  set_dropout(graph, attributes, spec);
  if (spec.ragged) attributes.set_max_total_seq_len_q(spec.max_total_q).set_max_total_seq_len_kv(spec.max_total_kv);
  auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, o, d_o, lse, attributes);
  mark_output(graph, dq, spec, kGradQ);
  mark_output(graph, dk, spec, kGradK);
  mark_output(graph, dv, spec, kGradV);
}

// A built or loaded graph with what execute needs of it.
std::shared_ptr<const BuiltGraph> finished(const std::shared_ptr<fe::graph::Graph>& graph) {
  auto built = std::make_shared<FrontendGraph>(graph);
  built->workspace_bytes = graph->get_workspace_size();
  for (int64_t uid : graph->get_variant_pack_uids_sorted()) built->operand_order.push_back(int(uid - 1));
  return built;
}

}  // namespace

std::shared_ptr<const BuiltGraph> build_graph(const GraphSpec& spec, void* cudnn_handle) {
  auto handle = static_cast<cudnnHandle_t>(cudnn_handle);
  try {
    auto graph = new_graph(spec);
    if (spec.op == GraphOp::forward)
      add_forward(*graph, spec);
    else
      add_backward(*graph, spec);
    check(graph->validate(), "rejected the graph");
    check(graph->build_operation_graph(handle), "could not build the operation graph");
    check(graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}), "found no execution plan");
    check(graph->check_support(handle), "supports no engine for this configuration");
    check(graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "could not build a plan");

    return finished(graph);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw BackendError(std::string("cudnn-frontend: ") + e.what());
  }
}

std::shared_ptr<const BuiltGraph> load_graph(const std::vector<uint8_t>& plan, void* cudnn_handle) {
  try {
    auto graph = std::make_shared<fe::graph::Graph>();
    // No warm-up: it captures a throwaway CUDA graph, which must not happen inside a caller's capture.
    check(graph->deserialize(static_cast<cudnnHandle_t>(cudnn_handle), plan, /*enforce_precompiled=*/true,
                             /*run_warmup=*/false),
          "could not load a persisted plan");
    return finished(graph);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw BackendError(std::string("cudnn-frontend: ") + e.what());
  }
}

void set_frontend_cudnn_library(void* dl_handle) { fe::cudnn_dlhandle = dl_handle; }

int64_t compiled_frontend_version() { return CUDNN_FRONTEND_VERSION; }
int64_t compiled_cudnn_version() { return CUDNN_VERSION; }
int64_t compiled_cuda_version() { return CUDART_VERSION; }

}  // namespace stridedfa
