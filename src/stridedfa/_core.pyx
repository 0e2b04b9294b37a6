# cython: language_level=3, boundscheck=False, wraparound=False
# distutils: language = c++
"""The Cython boundary: DLPack tensors in, calls into the C++ core, stridedfa errors out.

Intake reads each argument without copying, fastest path first:
  1. the DLPack C exchange API (``type(x).__dlpack_c_exchange_api__``, torch >= 2.10): a non-owning
     DLTensor in ~0.1 us, plus the producer's current work stream;
  2. ``x.__dlpack__(stream=..., max_version=(1, 3))``: a versioned or legacy capsule, consumed by the
     protocol's rules (major-version check, renamed to ``used_*``, deleter called exactly once).
The GIL is released while graphs are built and while they execute.
"""

# The included files use these names (cython-lint reads each file alone: hence no-cython-lint).
from cpython.exc cimport PyErr_Occurred  # no-cython-lint
from cpython.pycapsule cimport (PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New,  # no-cython-lint
                                PyCapsule_SetName)  # no-cython-lint
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject  # no-cython-lint
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uintptr_t  # no-cython-lint
from libc.stdlib cimport free, malloc  # no-cython-lint
from libc.string cimport memcpy, memset, strncpy  # no-cython-lint
from libcpp cimport bool as cbool  # no-cython-lint
from libcpp.optional cimport optional  # no-cython-lint
from libcpp.string cimport string  # no-cython-lint
from libcpp.vector cimport vector  # no-cython-lint

from stridedfa._cpp cimport (ArrayLayout, buffer_alloc, call_graph_key, CallOperands,  # no-cython-lint
                             buffer_free, CacheStats, CausalAlignment, classify_current_exception,  # no-cython-lint
                             compiled_cuda_version, compiled_cudnn_version,  # no-cython-lint
                             compiled_frontend_version, cuda_driver_version, cuda_runtime_version,  # no-cython-lint
                             contiguous_strides, cudnn_can_read, cudnn_runtime_version,  # no-cython-lint
                             decode_by_tokens, decode_graphs_bucketed, decode_heads_paged, decode_prefix_tail,  # no-cython-lint
                             decode_prefix_tail_rows,  # no-cython-lint
                             dense_strides_like,  # no-cython-lint
                             device_count, device_info, DeviceInfo, dtype_name, ErrorKind, execute,  # no-cython-lint
                             ExportQuirk, GraphOp, gradient_strides,  # no-cython-lint
                             graph_cache, jax_array_view, jax_backward_handler, jax_forward_handler,  # no-cython-lint
                             jax_block_table_view, jax_forward_inference_handler, jax_lengths_view,  # no-cython-lint
                             jax_per_head_view,  # no-cython-lint
                             jax_rng_state_view, jax_scores_view, jax_slopes_view,  # no-cython-lint
                             jax_stats_view, jax_thd_stats_view,  # no-cython-lint
                             kAlibiSlopes, kBias, kBlockTable, kCuSeqlensKV, kCuSeqlensQ, kGradBias,  # no-cython-lint
                             kGradK, kGradO, kGradQ, kGradSinks, kGradV, kK, kLse, kNumSlots, kO,  # no-cython-lint
                             kOperands, kQ, kRngState, kSeqLensKV, kSeqLensQ, kSinks, kV,  # no-cython-lint
                             length_bucket, libraries_loaded, OperandInfo, OperandKind,  # no-cython-lint
                             output_layout, OutputLayout,  # no-cython-lint
                             option_fields, OptionField, own_workspace_allocations,  # no-cython-lint
                             plan_store, PlanStore, PlanStoreStats,  # no-cython-lint
                             pool_stats, PoolStats, prepare_call, PreparedCall,  # no-cython-lint
                             Problem, raise_core_error, Reach, Role, SdpaOptions, select_packed,  # no-cython-lint
                             set_decode_by_tokens, set_decode_graphs_bucketed, set_decode_heads_paged,  # no-cython-lint
                             set_decode_prefix_tail, set_decode_prefix_tail_rows,  # no-cython-lint
                             set_error_translator, set_libraries, set_split_kv_enabled,  # no-cython-lint
                             set_split_kv_chunks, split_kv_enabled,  # no-cython-lint
                             stream_wait_stream,  # no-cython-lint
                             TensorView, to_core_axes, trim_pools, validate_call,  # no-cython-lint
                             validate_options, view_from_dltensor, quirk_applies_named)  # no-cython-lint
from stridedfa._dlpack cimport (DLDataType, DLManagedTensor, DLManagedTensorVersioned,  # no-cython-lint
                                DLPackExchangeAPI, DLPACK_FLAG_READ_ONLY, DLPACK_MAJOR_VERSION,  # no-cython-lint
                                DLPACK_MINOR_VERSION, DLDeviceType, DLTensor, kDLCUDA)  # no-cython-lint

import sys  # no-cython-lint

from stridedfa._errors import (BackendError, BoundsError, LayoutError, StridedFAError,  # no-cython-lint
                               UnsupportedError)  # no-cython-lint

# One concern per file; the C++ declarations they call are all in _cpp.pxd.
include "_errors.pxi"            # C++ exceptions -> stridedfa errors
include "_streams.pxi"           # which stream a call runs on
include "_table.pxi"             # the operand table as the boundary reads it
include "_intake.pxi"            # DLPack (and CuPy attribute) intake into a call's slots, by name
include "_options.pxi"           # the one parse of a call's options
include "_buffer.pxi"            # DeviceBuffer: memory stridedfa owns and exports by DLPack
include "_allocators.pxi"        # where outputs and workspace come from: one strategy per caller kind
include "_calls.pxi"             # the one call path (attend) and every entry point into it
include "_packed.pxi"            # the packed entry point: q/k/v views, one packed gradient
include "_jax_ffi.pxi"           # XLA FFI targets and JAX's trace-time validation
include "_shape_calls.pxi"       # calls described by shapes: JAX's and torch's checks, warm-up
include "_diagnostics.pxi"       # cache and pool counters, versions, devices, intake inspection
include "_test_hooks.pxi"        # pieces of the above for tests and benchmarks (validation and keys without a GPU)
