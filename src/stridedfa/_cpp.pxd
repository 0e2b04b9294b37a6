# Declarations of the C++ core's types (cpp/include/stridedfa). The functions that can throw are
# declared in _core.pyx, next to the handler that turns their exceptions into stridedfa errors.
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr
from libcpp.string cimport string

from stridedfa._dlpack cimport DLDataType, DLTensor


cdef extern from "stridedfa/errors.hpp" namespace "stridedfa" nogil:
    cpdef enum class ErrorKind(int):
        none
        layout
        unsupported
        backend
        other

    ErrorKind classify_current_exception(string& message) noexcept


cdef extern from "stridedfa/tensor_view.hpp" namespace "stridedfa" nogil:
    cdef cppclass TensorView:
        const char* name
        bool present
        int32_t ndim
        int64_t dims[8]
        int64_t strides[8]
        DLDataType dtype
        int32_t device_type
        int32_t device_id
        uintptr_t data
        bool read_only

    string dtype_name(DLDataType dtype)

    cdef enum class ExportQuirk(int32_t):
        none "stridedfa::ExportQuirk::none"
        cupy_unsigned_strides "stridedfa::ExportQuirk::cupy_unsigned_strides"


cdef extern from "stridedfa/sdpa.hpp" namespace "stridedfa" nogil:
    cpdef enum class CausalAlignment(int32_t):
        top_left
        bottom_right

    cdef cppclass SdpaOptions:
        bool has_scale
        double scale
        bool causal
        CausalAlignment alignment

    cdef cppclass ForwardArgs:
        TensorView q, k, v, out, lse

    cdef cppclass BackwardArgs:
        TensorView q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v

    cdef cppclass Problem:
        int64_t b, h_q, h_kv, s_q, s_kv, d_qk, d_v
        int32_t device
        DLDataType dtype
        bool nothing_to_do

    cdef cppclass PreparedCall:
        Problem problem
        int64_t workspace_bytes


cdef extern from "stridedfa/runtime.hpp" namespace "stridedfa" nogil:
    cdef cppclass DeviceInfo:
        int32_t ordinal
        int32_t sm_version
        string name


cdef extern from "stridedfa/graph_cache.hpp" namespace "stridedfa" nogil:
    cdef cppclass CacheStats:
        int64_t hits, misses, builds, build_failures, evictions, size, capacity
        double build_seconds

    cdef cppclass GraphCache:
        CacheStats stats()
        void clear()
        void set_capacity(size_t capacity)

    GraphCache& graph_cache()
