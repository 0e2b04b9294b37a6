# Included by _core.pyx: which CUDA stream a call runs on -- the caller's explicit stream, else
# the first producer's (torch's current stream via the exchange API, CuPy's current stream), else
# the legacy default stream -- and how producers on other streams are ordered before it.

cdef struct CallStream:
    cbool decided      # False until an explicit stream or the first producer fixes it
    uintptr_t handle   # the cudaStream_t the call runs on; 0 is the legacy default stream
    cbool after_cupy   # the call is already ordered after CuPy's current stream (CuPy intake)


cdef int parse_stream(object stream, CallStream* st) except -1:
    st.decided = False
    st.handle = 0
    st.after_cupy = False
    if stream is None:
        return 0
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol() if callable(protocol) else protocol
        handle = value[1]
    elif isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    else:
        raise TypeError(
            f"stream must be None, an int cudaStream_t handle or an object with __cuda_stream__, "
            f"got {type(stream).__name__}")
    if handle < 0:
        raise ValueError(f"stream handle must be >= 0, got {handle}")
    st.decided = True
    st.handle = <uintptr_t>handle
    return 0


cdef object _cupy_cuda = None  # the cupy.cuda module, once a CuPy array has been seen


cdef inline bint is_cupy_type(type tp):
    return tp.__module__.startswith("cupy")


cdef uintptr_t cupy_current_stream() except? 0:
    global _cupy_cuda
    if _cupy_cuda is None:
        import cupy.cuda
        _cupy_cuda = cupy.cuda
    return <uintptr_t>_cupy_cuda.get_current_stream().ptr


cdef object protocol_stream(uintptr_t handle):
    # The array-API stream protocol has no 0: the legacy default stream is spelled 1 (torch rejects
    # 0 and 2, JAX treats -1 as a handle; we never pass either).
    return 1 if handle == 0 else <object>handle


cdef inline uintptr_t canonical_handle(uintptr_t handle) noexcept:
    return 1 if handle == 0 else handle  # 0 and cudaStreamLegacy name the same stream
