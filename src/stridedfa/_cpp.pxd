# Declarations of the C++ core (cpp/include/stridedfa), header by header, and nothing else: the
# Cython modules that wrap them live beside this file (_core.pyx and its .pxi files).
#
# Functions that can throw are declared `except +raise_core_error`: Cython catches the C++
# exception and calls the translator that _core registers at import (_errors.pxi), which raises
# the stridedfa exception of the same kind (LayoutError, UnsupportedError, BackendError).
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.optional cimport optional
from libcpp.string cimport string
from libcpp.vector cimport vector

from stridedfa._dlpack cimport DLDataType, DLTensor


cdef extern from *:
    """
    // The translator of C++ exceptions into stridedfa errors, set once by _core at import.
    static int (*stridedfa_error_translator)(void) = 0;
    static int stridedfa_raise_core_error(void) { return stridedfa_error_translator(); }
    static void stridedfa_set_error_translator(int (*translator)(void)) { stridedfa_error_translator = translator; }
    """
    int raise_core_error "stridedfa_raise_core_error"() except -1
    void set_error_translator "stridedfa_set_error_translator"(int (*translator)() except -1)


cdef extern from "stridedfa/errors.hpp" namespace "stridedfa" nogil:
    cpdef enum class ErrorKind(int):
        none
        layout
        unsupported
        backend
        other
        bounds

    ErrorKind classify_current_exception(string& message) noexcept


cdef extern from "stridedfa/tensor_view.hpp" namespace "stridedfa" nogil:
    cdef cppclass TensorView:
        const char* name
        cbool present
        int32_t ndim
        int64_t dims[8]
        int64_t strides[8]
        DLDataType dtype
        int32_t device_type
        int32_t device_id
        uintptr_t data
        cbool read_only
        int8_t caller_axes[8]

    string dtype_name(DLDataType dtype)

    cdef enum class ExportQuirk(int32_t):
        none "stridedfa::ExportQuirk::none"
        cupy_unsigned_strides "stridedfa::ExportQuirk::cupy_unsigned_strides"

    TensorView view_from_dltensor(const DLTensor& tensor, cbool read_only, const char* name,
                                  ExportQuirk quirk) except +raise_core_error


cdef extern from "stridedfa/sdpa_types.hpp" namespace "stridedfa" nogil:
    cpdef enum class CausalAlignment(int32_t):
        top_left
        bottom_right

    cdef cppclass SdpaOptions:
        cbool has_scale
        double scale
        cbool causal
        CausalAlignment alignment
        int64_t window_left
        int64_t window_right
        cbool deterministic
        double softcap
        double dropout_p
        int64_t max_seqlen_q
        int64_t max_seqlen_kv

    cdef struct OptionField:
        const char* name
        char type
        double real
        int64_t integer

    vector[OptionField] option_fields(const SdpaOptions& options) except +raise_core_error

    cdef enum class Role(int32_t):
        absent
        input
        output

    cdef enum class GraphOp(int64_t):
        forward
        backward

    cdef enum class OperandKind(int32_t):
        attention
        stats
        lengths
        per_head
        scores
        philox
        cumulative
        page_table
        fp8_scale

    cdef enum class Reach(int32_t):
        unlimited
        elements_2_32
        bytes_2_32

    # The operand table's slots (enum Slot): declared unnamed so that they index C arrays as ints.
    cdef enum:
        kQ, kK, kV, kO, kLse, kGradO, kGradQ, kGradK, kGradV, kSeqLensQ, kSeqLensKV, kSinks, kGradSinks, kBias,
        kGradBias, kAlibiSlopes, kRngState, kCuSeqlensQ, kCuSeqlensKV, kBlockTable, kNumSlots

    cdef struct OperandInfo:
        const char* name
        Role forward
        Role backward
        cbool forward_optional
        cbool backward_optional
        OperandKind kind
        int32_t shape[4]
        const char* shape_meaning
        Reach backward_reach

    const OperandInfo kOperands[kNumSlots]

    # One call: its op and its operands in slot order (sdpa_types.hpp).
    cdef cppclass CallOperands:
        GraphOp op
        TensorView slot[kNumSlots]

    cdef cppclass Problem:
        int64_t b, h_q, h_kv, s_q, s_kv, d_qk, d_v
        int32_t device
        DLDataType dtype
        cbool nothing_to_do
        cbool ragged
        int64_t sequences


cdef extern from "stridedfa/validate.hpp" namespace "stridedfa" nogil:
    Problem validate_call(const CallOperands& call) except +raise_core_error
    void validate_options(const SdpaOptions& options, const Problem& problem) except +raise_core_error


cdef extern from "stridedfa/sdpa.hpp" namespace "stridedfa" nogil:
    cdef cppclass PreparedCall:
        Problem problem
        int64_t workspace_bytes

    cbool cudnn_can_read(const TensorView& t)
    PreparedCall prepare_call(const CallOperands& call, const SdpaOptions& options) except +raise_core_error
    vector[int64_t] call_graph_key(const CallOperands& call, const SdpaOptions& options, int sm_version,
                                   int64_t cudnn_version) except +raise_core_error
    void execute(const PreparedCall& call, uintptr_t stream, void* workspace) except +raise_core_error
    int64_t own_workspace_allocations()


cdef extern from "stridedfa/layout_rules.hpp" namespace "stridedfa" nogil:
    void dense_strides_like(const int64_t* shape, const int64_t* like_strides, int ndim,
                            int64_t* strides) noexcept
    cbool is_dense(const int64_t* shape, const int64_t* strides, int ndim) noexcept
    void gradient_strides(const TensorView& like, int64_t* strides) noexcept
    TensorView select_packed(const TensorView& packed, int dim, int index, const int* to_logical,
                             const char* name) noexcept
    TensorView to_core_axes(const TensorView& layout_view, const int* to_logical,
                            const char* name) noexcept
    cdef cppclass OutputLayout:
        int ndim
        int64_t shape[8]
        int64_t strides[8]
        DLDataType dtype
    OutputLayout output_layout(const CallOperands& call, int slot) noexcept
    void contiguous_strides(const int64_t* shape, int ndim, int64_t* strides) noexcept


cdef extern from "stridedfa/runtime.hpp" namespace "stridedfa" nogil:
    cdef cppclass DeviceInfo:
        int32_t ordinal
        int32_t sm_version
        string name

    cdef cppclass PoolStats:
        int64_t reserved_bytes, used_bytes, retain_bytes

    void set_libraries(void* cudnn_dl_handle, const string& cudart_path) except +raise_core_error
    cbool libraries_loaded()
    int64_t cudnn_runtime_version() except +raise_core_error
    int cuda_runtime_version() except +raise_core_error
    int cuda_driver_version() except +raise_core_error
    int device_count() except +raise_core_error
    const DeviceInfo& device_info(int ordinal) except +raise_core_error
    void stream_wait_stream(int32_t device, uintptr_t consumer, uintptr_t producer) except +raise_core_error
    void trim_pools() except +raise_core_error
    PoolStats pool_stats() except +raise_core_error
    void* buffer_alloc(int32_t device, int64_t nbytes, uintptr_t stream) except +raise_core_error
    void buffer_free(int32_t device, void* ptr, uintptr_t stream, cbool synchronize) noexcept


cdef extern from "stridedfa/call_plan.hpp" namespace "stridedfa" nogil:
    cbool decode_graphs_bucketed()
    void set_decode_graphs_bucketed(cbool bucketed)
    cbool decode_heads_paged()
    void set_decode_heads_paged(cbool paged)
    cbool decode_by_tokens()
    void set_decode_by_tokens(cbool enabled)
    cbool decode_prefix_tail()
    void set_decode_prefix_tail(cbool enabled)
    cbool decode_prefix_tail_rows()
    void set_decode_prefix_tail_rows(cbool enabled)


cdef extern from "stridedfa/split_kv.hpp" namespace "stridedfa" nogil:
    cbool split_kv_enabled()
    void set_split_kv_enabled(cbool enabled)
    void set_split_kv_chunks(int64_t chunks)


cdef extern from "stridedfa/graph_cache.hpp" namespace "stridedfa" nogil:
    cdef cppclass CacheStats:
        int64_t hits, misses, builds, build_failures, evictions, size, capacity
        double build_seconds

    cdef cppclass GraphCache:
        CacheStats stats()
        void clear()
        void set_capacity(size_t capacity)

    GraphCache& graph_cache()


cdef extern from "stridedfa/ragged.hpp" namespace "stridedfa" nogil:
    int64_t length_bucket(int64_t n)


cdef extern from "stridedfa/plan_store.hpp" namespace "stridedfa" nogil:
    cdef cppclass PlanStoreStats:
        int64_t loads, load_rejections, saves, save_failures, evictions

    cdef cppclass PlanStore:
        PlanStore(string directory, int64_t max_bytes)
        cbool enabled()
        const string& directory()
        int64_t max_bytes()
        optional[vector[uint8_t]] load(const vector[int64_t]& key, const string& context)
        cbool save(const vector[int64_t]& key, const string& context, const vector[uint8_t]& payload)
        int64_t clear()
        void usage(int64_t* files, int64_t* nbytes)
        PlanStoreStats stats()

    PlanStore& plan_store()


cdef extern from "stridedfa/cudnn_graphs.hpp" namespace "stridedfa" nogil:
    int64_t compiled_frontend_version()
    int64_t compiled_cudnn_version()
    int64_t compiled_cuda_version()


cdef extern from "stridedfa/jax_ffi.hpp" namespace "stridedfa::jax_ffi" nogil:
    cdef enum class ArrayLayout(int64_t):
        bshd
        bhsd
        thd

    TensorView jax_array_view "stridedfa::jax_ffi::array_view"(
        const char* name, const int64_t* dims, int64_t rank, ArrayLayout layout, DLDataType dtype,
        int device, uintptr_t data) except +raise_core_error
    TensorView jax_stats_view "stridedfa::jax_ffi::stats_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_thd_stats_view "stridedfa::jax_ffi::thd_stats_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_lengths_view "stridedfa::jax_ffi::lengths_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_block_table_view "stridedfa::jax_ffi::block_table_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_per_head_view "stridedfa::jax_ffi::per_head_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_rng_state_view "stridedfa::jax_ffi::rng_state_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    TensorView jax_scores_view "stridedfa::jax_ffi::scores_view"(
        const char* name, const int64_t* dims, int64_t rank, int64_t mapped, int64_t batch, DLDataType dtype,
        int device, uintptr_t data) except +raise_core_error
    TensorView jax_slopes_view "stridedfa::jax_ffi::slopes_view"(
        const char* name, const int64_t* dims, int64_t rank, DLDataType dtype, int device,
        uintptr_t data) except +raise_core_error
    void* jax_forward_handler "stridedfa::jax_ffi::forward_handler"()
    void* jax_forward_inference_handler "stridedfa::jax_ffi::forward_inference_handler"()
    void* jax_backward_handler "stridedfa::jax_ffi::backward_handler"()


cdef extern from "stridedfa/cudnn_quirks.hpp" namespace "stridedfa" nogil:
    # except +: an unknown name throws std::invalid_argument, which Cython raises as ValueError
    cbool quirk_applies_named(const char* name, int64_t cudnn_version) except +
