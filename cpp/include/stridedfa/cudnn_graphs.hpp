// The boundary around cudnn-frontend. cudnn_graphs.cpp is the only translation unit that includes
// cudnn_frontend.h (about a minute and a half of compile time per file that does); everything the
// rest of the core needs from it is declared here without frontend types.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stridedfa/sdpa_types.hpp"

namespace stridedfa {

struct OperandDesc {
  bool present = false;
  int64_t dims[4] = {};
  int64_t strides[4] = {};  // extent-1 axes already given a canonical stride
};

// Everything that determines a built graph. Two calls with equal specs can share one graph; the
// graph cache keys on key(), which lists every field.
struct GraphSpec {
  GraphOp op = GraphOp::forward;
  DLDataType dtype{};  // of every operand but the statistics (float32)
  OperandDesc operands[kNumSlots];
  float scale = 1.0f;
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::top_left;
  int64_t left_bound = SdpaOptions::kUnbounded;   // window left, in tokens (FlashAttention's)
  int64_t right_bound = SdpaOptions::kUnbounded;  // 0 for causal
  bool deterministic = false;                     // backward only
  float softcap = 0.0f;                           // > 0: scores -> softcap * tanh(scores / softcap)
  // ALiBi (with operands[kAlibiSlopes]): scores -= slope_h * |i - j + alibi_offset| in the indices
  // cuDNN sees (bottom-right with padding lengths, a per-sequence offset, is refused: set_alibi).
  int64_t alibi_offset = 0;
  float dropout_p = 0.0f;  // > 0 with operands[kRngState]: Philox dropout, the same mask forward and backward
  // A variable-length call: every token-axis operand has a ragged offset tensor (UID
  // kRaggedOffsetTensor + slot + 1), and cuDNN sizes its workspace by these token counts.
  bool ragged = false;
  int64_t max_total_q = 0, max_total_kv = 0;
  int32_t device = 0;
  int32_t sm_version = 0;
  int64_t cudnn_version = 0;

  // Every field as integers: equal keys, equal graphs. write_key fills `out` (kMaxKeyLength
  // entries) without allocating and returns the length.
  static constexpr int kMaxKeyLength = 18 + kNumSlots * 9;
  int write_key(int64_t* out) const;
  std::vector<int64_t> key() const;
};

class BuiltGraph {
 public:
  virtual ~BuiltGraph() = default;
  // Launch with pointers in operand_order, on the stream bound to `cudnn_handle`.
  virtual void execute(void* cudnn_handle, void* const* ptrs, void* workspace) const = 0;
  // The execution plan as bytes load_graph takes back (in a process with the same cuDNN, GPU and
  // graph-building code: see plan_store.hpp). Throws UnsupportedError / BackendError.
  virtual std::vector<uint8_t> serialize() const = 0;

  int64_t workspace_bytes = 0;
  // The operands in cuDNN's sorted-UID order; kRngOffsetTensor stands for rng_state's second value,
  // kRaggedOffsetTensor + slot for a slot's ragged offsets.
  std::vector<int> operand_order;
};

// Builds and plans the graph on the current device. Throws UnsupportedError with cuDNN's reason
// when no engine supports it, BackendError when cuDNN fails.
std::shared_ptr<const BuiltGraph> build_graph(const GraphSpec& spec, void* cudnn_handle);

// The graph whose plan `plan` holds (BuiltGraph::serialize), on the current device, without a
// build. Throws UnsupportedError / BackendError when cuDNN cannot load it.
std::shared_ptr<const BuiltGraph> load_graph(const std::vector<uint8_t>& plan, void* cudnn_handle);

// The graph of `spec` (whose graph-cache key is `key`): loaded from the persisted plans
// (plan_store()) when a plan for it and this process's cuDNN, GPU and driver is there, else built
// and then saved there. A plan that cannot be saved or loaded only costs a build.
std::shared_ptr<const BuiltGraph> load_or_build_graph(const GraphSpec& spec, const std::vector<int64_t>& key,
                                                      void* cudnn_handle);

// Sets cudnn-frontend's libcudnn handle; must run before any other frontend call.
void set_frontend_cudnn_library(void* dl_handle);

// Versions the extension was compiled against (cudnn-frontend 1.32.0 -> 13200; cuDNN 9.28.1 -> 92801).
int64_t compiled_frontend_version();
int64_t compiled_cudnn_version();
int64_t compiled_cuda_version();

}  // namespace stridedfa
