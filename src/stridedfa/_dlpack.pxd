# DLPack 1.3 C declarations (cpp/include/stridedfa/dlpack.h, written from the DLPack spec).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "stridedfa/dlpack.h" nogil:
    uint64_t DLPACK_FLAG_READ_ONLY "STRIDEDFA_DLPACK_FLAG_READ_ONLY"
    uint32_t DLPACK_MAJOR_VERSION "STRIDEDFA_DLPACK_MAJOR_VERSION"
    uint32_t DLPACK_MINOR_VERSION "STRIDEDFA_DLPACK_MINOR_VERSION"

    ctypedef struct DLPackVersion:
        uint32_t major
        uint32_t minor

    ctypedef enum DLDeviceType:
        kDLCPU
        kDLCUDA
        kDLCUDAHost
        kDLCUDAManaged

    ctypedef struct DLDevice:
        DLDeviceType device_type
        int32_t device_id

    ctypedef struct DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes

    ctypedef struct DLTensor:
        void* data
        DLDevice device
        int32_t ndim
        DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset

    ctypedef struct DLManagedTensor:
        DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(DLManagedTensor*) noexcept nogil

    ctypedef struct DLManagedTensorVersioned:
        DLPackVersion version
        void* manager_ctx
        void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
        uint64_t flags
        DLTensor dl_tensor

    ctypedef struct DLPackExchangeAPIHeader:
        DLPackVersion version
        DLPackExchangeAPIHeader* prev_api

    ctypedef void (*DLPackSetError)(void* error_ctx, const char* kind, const char* message) noexcept

    ctypedef struct DLPackExchangeAPI:
        DLPackExchangeAPIHeader header
        int (*managed_tensor_allocator)(DLTensor* prototype, DLManagedTensorVersioned** out,
                                        void* error_ctx, DLPackSetError set_error) noexcept
        int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned* tensor,
                                                   void** out_py_object) noexcept
        int (*managed_tensor_from_py_object_no_sync)(void* py_object, DLManagedTensorVersioned** out) noexcept
        int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out) noexcept
        int (*current_work_stream)(DLDeviceType device_type, int32_t device_id, void** out_stream) noexcept
