// How the core obtains a graph on a cache miss: from the persisted plans when it can, else by a
// build whose plan is then persisted (plan_store.hpp says what a plan file holds and when it is
// trusted).
#include <string>

#include "stridedfa/cudnn_graphs.hpp"
#include "stridedfa/errors.hpp"
#include "stridedfa/plan_store.hpp"
#include "stridedfa/runtime.hpp"

#ifndef STRIDEDFA_GRAPH_CODE_ID
#error "CMake defines STRIDEDFA_GRAPH_CODE_ID: a hash of the sources that turn a GraphSpec into a graph"
#endif

namespace stridedfa {
namespace {

// Everything besides the graph-cache key that decides whether a saved plan is valid here: the
// code that builds graphs from specs (a hash of its sources, so an edit invalidates every plan),
// cudnn-frontend, the cuDNN and CUDA libraries loaded, the driver, and the GPU (model, compute
// capability, multiprocessors).
std::string plan_context(const GraphSpec& spec) {
  const DeviceInfo& device = device_info(spec.device);
  return std::string("graphs ") + STRIDEDFA_GRAPH_CODE_ID + "; cudnn-frontend " +
         std::to_string(compiled_frontend_version()) + "; cudnn " + std::to_string(cudnn_runtime_version()) +
         "; cuda runtime " + std::to_string(cuda_runtime_version()) + "; driver " +
         std::to_string(cuda_driver_version()) + "; gpu " + device.name + " sm " + std::to_string(device.sm_version) +
         " x" + std::to_string(device.sm_count);
}

}  // namespace

std::shared_ptr<const BuiltGraph> load_or_build_graph(const GraphSpec& spec, const std::vector<int64_t>& key,
                                                      void* cudnn_handle) {
  PlanStore& store = plan_store();
  std::string context;
  try {
    if (store.enabled()) context = plan_context(spec);
  } catch (const std::exception&) {  // the facts a plan is keyed by are unknown: no persistence
  }
  if (context.empty()) return build_graph(spec, cudnn_handle);
  if (std::optional<std::vector<uint8_t>> plan = store.load(key, context)) {
    try {
      return load_graph(*plan, cudnn_handle);
    } catch (const std::exception&) {
      store.reject(key, context);  // e.g. a plan cuDNN no longer accepts: built again below
    }
  }
  std::shared_ptr<const BuiltGraph> built = build_graph(spec, cudnn_handle);
  try {
    store.save(key, context, built->serialize());
  } catch (const std::exception&) {
    // A plan that cannot be serialized (or memory for it) is only not persisted: the call has its graph.
  }
  return built;
}

}  // namespace stridedfa
