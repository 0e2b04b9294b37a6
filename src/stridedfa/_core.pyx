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

from cpython.pycapsule cimport (PyCapsule_GetPointer, PyCapsule_IsValid,
                                PyCapsule_SetName)
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libcpp cimport bool as cbool
from libcpp.string cimport string
from libcpp.vector cimport vector

from stridedfa._cpp cimport (BackwardArgs, CacheStats, CausalAlignment, DeviceInfo, ErrorKind,
                             ExportQuirk, ForwardArgs, PreparedCall, Problem, SdpaOptions, TensorView,
                             classify_current_exception, dtype_name, graph_cache)
from stridedfa._dlpack cimport (DLDataType, DLManagedTensor, DLManagedTensorVersioned,
                                DLPackExchangeAPI, DLPACK_FLAG_READ_ONLY, DLPACK_MAJOR_VERSION,
                                DLPACK_MINOR_VERSION, DLDeviceType, DLTensor, kDLCUDA)

from stridedfa._errors import BackendError, LayoutError, StridedFAError, UnsupportedError


# --- Errors -------------------------------------------------------------------------------------

cdef int raise_core_error() except -1:
    """Turns the C++ exception in flight into the stridedfa exception of the same kind."""
    cdef string message
    cdef ErrorKind kind = classify_current_exception(message)
    text = message.decode("utf-8", "replace")
    if kind == ErrorKind.layout:
        raise LayoutError(text)
    if kind == ErrorKind.unsupported:
        raise UnsupportedError(text)
    if kind == ErrorKind.backend:
        raise BackendError(text)
    raise StridedFAError("internal error in the stridedfa core: " + text)


# The core's entry points that can throw; every exception goes through raise_core_error.
cdef extern from "stridedfa/tensor_view.hpp" namespace "stridedfa" nogil:
    TensorView view_from_dltensor(const DLTensor& tensor, cbool read_only, const char* name,
                                  ExportQuirk quirk) except +raise_core_error

cdef extern from "stridedfa/sdpa.hpp" namespace "stridedfa" nogil:
    cbool cudnn_can_read(const TensorView& t)
    Problem validate_forward(const ForwardArgs& args) except +raise_core_error
    Problem validate_backward(const BackwardArgs& args) except +raise_core_error
    PreparedCall prepare_forward(const ForwardArgs& args, const SdpaOptions& options) except +raise_core_error
    PreparedCall prepare_backward(const BackwardArgs& args, const SdpaOptions& options) except +raise_core_error
    vector[int64_t] forward_graph_key(const ForwardArgs& args, const SdpaOptions& options, int sm_version,
                                      int64_t cudnn_version) except +raise_core_error
    vector[int64_t] backward_graph_key(const BackwardArgs& args, const SdpaOptions& options, int sm_version,
                                       int64_t cudnn_version) except +raise_core_error
    void execute(const PreparedCall& call, uintptr_t stream, void* workspace) except +raise_core_error
    int64_t own_workspace_allocations()

cdef extern from "stridedfa/runtime.hpp" namespace "stridedfa" nogil:
    void set_libraries(void* cudnn_dl_handle, const string& cudart_path) except +raise_core_error
    cbool libraries_loaded()
    int64_t cudnn_runtime_version() except +raise_core_error
    int cuda_runtime_version() except +raise_core_error
    int cuda_driver_version() except +raise_core_error
    int device_count() except +raise_core_error
    const DeviceInfo& device_info(int ordinal) except +raise_core_error
    void stream_wait_stream(int32_t device, uintptr_t consumer, uintptr_t producer) except +raise_core_error
    void trim_pools() except +raise_core_error
    cdef cppclass PoolStats:
        int64_t reserved_bytes, used_bytes, retain_bytes
    PoolStats pool_stats() except +raise_core_error

cdef extern from "stridedfa/cudnn_graphs.hpp" namespace "stridedfa" nogil:
    int64_t compiled_frontend_version()
    int64_t compiled_cudnn_version()
    int64_t compiled_cuda_version()


# --- Streams ------------------------------------------------------------------------------------

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


cdef uintptr_t default_stream_of(object obj) except? 0:
    """The stream a call runs on when `obj`, a producer without the DLPack C exchange API, is the
    first to decide it: CuPy's current stream for CuPy arrays (what a CuPy caller expects, and no
    cross-stream event is then needed), else the legacy default stream (0)."""
    if not is_cupy_type(type(obj)):
        return 0
    return cupy_current_stream()


cdef object protocol_stream(uintptr_t handle):
    # The array-API stream protocol has no 0: the legacy default stream is spelled 1 (torch rejects
    # 0 and 2, JAX treats -1 as a handle; we never pass either).
    return 1 if handle == 0 else <object>handle


# --- DLPack intake ------------------------------------------------------------------------------

cdef dict _exchange_apis = {}  # type -> address of its DLPackExchangeAPI, 0 if none (keeps types alive)


cdef const DLPackExchangeAPI* exchange_api_of(type tp) except? NULL:
    cached = _exchange_apis.get(tp)
    if cached is None:
        address = 0
        capsule = getattr(tp, "__dlpack_c_exchange_api__", None)
        if capsule is not None and PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
            api = <const DLPackExchangeAPI*>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
            if api.header.version.major == DLPACK_MAJOR_VERSION:
                address = <uintptr_t>api
        _exchange_apis[tp] = address
        cached = address
    return <const DLPackExchangeAPI*><uintptr_t>cached


cdef struct Owned:
    DLManagedTensorVersioned* versioned
    DLManagedTensor* legacy


cdef void release(Owned* owned, int n) noexcept:
    """Calls each consumed tensor's deleter, exactly once."""
    cdef int i
    for i in range(n):
        if owned[i].versioned != NULL:
            if owned[i].versioned.deleter != NULL:
                owned[i].versioned.deleter(owned[i].versioned)
            owned[i].versioned = NULL
        if owned[i].legacy != NULL:
            if owned[i].legacy.deleter != NULL:
                owned[i].legacy.deleter(owned[i].legacy)
            owned[i].legacy = NULL


cdef object call_dlpack(object obj, object stream, const char* name):
    method = getattr(obj, "__dlpack__", None)
    if method is None:
        raise TypeError(f"{name.decode()}: expected a DLPack tensor (an object with __dlpack__), "
                        f"got {type(obj).__module__}.{type(obj).__qualname__}")
    try:
        return method(stream=stream, max_version=(DLPACK_MAJOR_VERSION, 3))
    except TypeError:  # a producer that predates max_version
        return method(stream=stream)


cdef int consume_capsule(object capsule, const char* name, TensorView* view, Owned* owned,
                         ExportQuirk quirk=ExportQuirk.none) except -1:
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* legacy
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        # Renamed first: from here on the capsule's destructor leaves the tensor to us.
        PyCapsule_SetName(capsule, b"used_dltensor_versioned")
        owned.versioned = versioned
        if versioned.version.major != DLPACK_MAJOR_VERSION:
            raise UnsupportedError(
                f"{name.decode()}: its producer exported DLPack {versioned.version.major}."
                f"{versioned.version.minor}; stridedfa reads DLPack {DLPACK_MAJOR_VERSION}.x")
        view[0] = view_from_dltensor(versioned.dl_tensor,
                                     (versioned.flags & DLPACK_FLAG_READ_ONLY) != 0, name, quirk)
        return 0
    if PyCapsule_IsValid(capsule, b"dltensor"):
        legacy = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        PyCapsule_SetName(capsule, b"used_dltensor")
        owned.legacy = legacy
        view[0] = view_from_dltensor(legacy.dl_tensor, False, name, quirk)
        return 0
    raise TypeError(f"{name.decode()}.__dlpack__() did not return an unconsumed DLPack capsule "
                    f"(got {capsule!r})")


# --- CuPy arrays, read from their own attributes ---------------------------------------------------
#
# CuPy has no DLPack C exchange API, and its __dlpack__ costs microseconds per tensor (it queries
# the pointer's memory type with cudaPointerGetAttributes on every export) and, in CuPy 14.2,
# exports negative strides wrongly (ExportQuirk.cupy_unsigned_strides). A CuPy array over plain
# device memory is therefore read from its public attributes -- data.ptr, data.device_id, shape,
# strides (signed bytes), dtype -- and ordered the way __dlpack__(stream=...) orders it: a call on
# another stream than CuPy's current one waits for that stream. Other CuPy arrays (managed or
# foreign memory, dtypes without a DLPack code here) go through __dlpack__.

cdef tuple _cupy_device_memory = None  # CuPy memory types that are plain device memory
cdef dict _cupy_dtypes = None          # numpy dtype -> (DLPack code, bits)


cdef int load_cupy_types() except -1:
    global _cupy_device_memory, _cupy_dtypes
    import numpy
    from cupy.cuda import memory
    _cupy_device_memory = tuple(getattr(memory, name) for name in ("PooledMemory", "Memory", "MemoryAsync")
                                if hasattr(memory, name))
    _cupy_dtypes = {numpy.dtype(numpy.float16): (2, 16), numpy.dtype(numpy.float32): (2, 32),
                    numpy.dtype(numpy.float64): (2, 64), numpy.dtype(numpy.int32): (0, 32),
                    numpy.dtype(numpy.int64): (0, 64)}
    return 0


cdef int intake_cupy(object obj, const char* name, CallStream* st, TensorView* view) except -1:
    """Reads a CuPy array without DLPack; returns 1 when done, 0 when it must take the protocol."""
    cdef DLTensor t
    cdef int64_t shape[8]
    cdef int64_t strides[8]
    cdef int i, ndim
    cdef int64_t itemsize
    cdef uintptr_t current
    if _cupy_device_memory is None:
        load_cupy_types()
    memptr = obj.data
    if not isinstance(memptr.mem, _cupy_device_memory):
        return 0
    code_bits = _cupy_dtypes.get(obj.dtype)
    if code_bits is None:
        return 0
    dims = obj.shape
    byte_strides = obj.strides
    ndim = len(dims)
    if ndim > 8:
        return 0  # the protocol path reports it
    t.dtype.code = code_bits[0]
    t.dtype.bits = code_bits[1]
    t.dtype.lanes = 1
    itemsize = code_bits[1] // 8
    for i in range(ndim):
        shape[i] = dims[i]
        if byte_strides[i] % itemsize != 0:
            raise LayoutError(f"{name.decode()}: axis {i} has a stride of {byte_strides[i]} bytes, not a "
                              f"multiple of its {itemsize}-byte elements; pass a copy "
                              f"(cupy.ascontiguousarray(x))")
        strides[i] = byte_strides[i] // itemsize
    t.data = <void*><uintptr_t>memptr.ptr
    t.device.device_type = kDLCUDA
    t.device.device_id = memptr.device_id
    t.ndim = ndim
    t.shape = shape
    t.strides = strides
    t.byte_offset = 0
    view[0] = view_from_dltensor(t, False, name, ExportQuirk.none)
    if not st.after_cupy:
        current = cupy_current_stream()
        if not st.decided:
            st.decided = True
            st.handle = current
        elif canonical_handle(current) != canonical_handle(st.handle):
            ensure_libraries()
            stream_wait_stream(view.device_id, st.handle, current)
        st.after_cupy = True
    return 1


cdef inline uintptr_t canonical_handle(uintptr_t handle) noexcept:
    return 1 if handle == 0 else handle  # 0 and cudaStreamLegacy name the same stream


cdef int intake(object obj, const char* name, cbool is_output, CallStream* st,
                TensorView* view, Owned* owned) except -1:
    """Reads one argument into `view` without copying; decides the call's stream if still open."""
    cdef type tp = type(obj)
    cdef const DLPackExchangeAPI* api = exchange_api_of(tp)
    cdef DLTensor borrowed
    cdef DLManagedTensorVersioned* managed = NULL
    cdef void* current = NULL
    cdef ExportQuirk quirk = ExportQuirk.none
    if api != NULL:
        if api.dltensor_from_py_object_no_sync != NULL:
            if api.dltensor_from_py_object_no_sync(<void*>obj, &borrowed) != 0:
                return -1
            view[0] = view_from_dltensor(borrowed, False, name, ExportQuirk.none)
        else:
            if api.managed_tensor_from_py_object_no_sync(<void*>obj, &managed) != 0:
                return -1
            owned.versioned = managed
            view[0] = view_from_dltensor(managed.dl_tensor, (managed.flags & DLPACK_FLAG_READ_ONLY) != 0,
                                         name, ExportQuirk.none)
        if view.device_type != kDLCUDA:
            return 0  # the validator reports the device with the call's context
        if api.current_work_stream(kDLCUDA, view.device_id, &current) != 0:
            return -1
        if not st.decided:
            st.decided = True
            st.handle = <uintptr_t>current
        if <uintptr_t>current == st.handle:
            return 0  # produced on the stream we run on: no synchronisation needed
        # Another stream: let the producer order its work before ours through the protocol.
        release(owned, 1)
        view.present = False
    elif is_cupy_type(tp):
        if tp.__name__ == "ndarray" and intake_cupy(obj, name, st, view):
            return 0
        quirk = ExportQuirk.cupy_unsigned_strides

    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        device_type, device_id = device()
        if device_type != kDLCUDA:
            # Without a CUDA device there is no stream to pass; report it like the validator would.
            kind = {1: "CPU", 3: "CUDA host (pinned) memory", 13: "CUDA managed memory", 10: "ROCm"}.get(
                device_type, f"DLPack device type {device_type}")
            raise LayoutError(
                f"{name.decode()} needs a CUDA device; it lives in {kind} ({tp.__module__}."
                f"{tp.__qualname__}). Move it to the GPU first (torch: x.cuda(), CuPy: "
                f"cupy.asarray(x), JAX: jax.device_put(x, gpu)).")
    if not st.decided:
        st.decided = True
        st.handle = default_stream_of(obj)
    consume_capsule(call_dlpack(obj, protocol_stream(st.handle), name), name, view, owned, quirk)
    if is_output and tp.__module__.startswith(("jax", "jaxlib")):
        view.read_only = True  # JAX arrays are immutable though their DLPack export does not say so
    return 0


# --- Calls --------------------------------------------------------------------------------------

cdef const char* SLOT_NAMES[9]
SLOT_NAMES[:] = [b"q", b"k", b"v", b"out", b"lse", b"grad_out", b"grad_q", b"grad_k", b"grad_v"]


cdef int parse_options(object scale, object causal, object causal_alignment,
                       SdpaOptions* options) except -1:
    if scale is None:
        options.has_scale = False
    else:
        if isinstance(scale, bool):
            raise TypeError("scale must be a number, got bool")
        options.has_scale = True
        options.scale = float(scale)
    options.causal = bool(causal)
    if causal_alignment == "top_left":
        options.alignment = CausalAlignment.top_left
    elif causal_alignment == "bottom_right":
        options.alignment = CausalAlignment.bottom_right
    else:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}")
    return 0


cdef ensure_libraries():
    if libraries_loaded():
        return
    from stridedfa import _loader
    libs = _loader.load()  # raises BackendError saying what was looked for
    cdef string cudart = libs.cudart.path.encode()
    set_libraries(<void*><uintptr_t>libs.cudnn.handle, cudart)


cdef enum Mode:
    RUN = 0       # validate, look up or build the graph, execute
    VALIDATE = 1  # validate only (returns what validation established)
    KEY = 2       # validate and return the graph-cache key for given device facts


cdef dict problem_dict(Problem p):
    return {"b": p.b, "h_q": p.h_q, "h_kv": p.h_kv, "s_q": p.s_q, "s_kv": p.s_kv, "d_qk": p.d_qk,
            "d_v": p.d_v, "device": p.device, "dtype": dtype_name(p.dtype).decode(),
            "nothing_to_do": p.nothing_to_do}


cdef object run(bint backward, tuple tensors, SdpaOptions options, object stream,
                object workspace_allocator, Mode mode=RUN, int sm_version=0, int64_t cudnn_version=0,
                int64_t repeats=1):
    """One call: intake of every tensor (slot order), then validation / preparation / execution.
    Consumed DLPack tensors are released on every path, exactly once."""
    cdef ForwardArgs fwd
    cdef BackwardArgs bwd
    cdef TensorView* views[9]
    cdef Owned owned[9]
    cdef CallStream st
    cdef PreparedCall call
    cdef Problem problem
    cdef vector[int64_t] key
    cdef void* workspace = NULL
    cdef uintptr_t workspace_address
    cdef int i, n = 9 if backward else 5, first_output = 6 if backward else 3
    if backward:
        views[0] = &bwd.q; views[1] = &bwd.k; views[2] = &bwd.v; views[3] = &bwd.out
        views[4] = &bwd.lse; views[5] = &bwd.grad_out; views[6] = &bwd.grad_q
        views[7] = &bwd.grad_k; views[8] = &bwd.grad_v
    else:
        views[0] = &fwd.q; views[1] = &fwd.k; views[2] = &fwd.v; views[3] = &fwd.out; views[4] = &fwd.lse
    for i in range(n):
        owned[i].versioned = NULL
        owned[i].legacy = NULL
    keep_alive = []
    parse_stream(stream, &st)
    try:
        for i in range(n):
            if tensors[i] is not None:
                intake(tensors[i], SLOT_NAMES[i], i >= first_output, &st, views[i], &owned[i])
        if mode == VALIDATE:
            with nogil:
                problem = validate_backward(bwd) if backward else validate_forward(fwd)
            return problem_dict(problem)
        if mode == KEY:
            with nogil:
                if backward:
                    key = backward_graph_key(bwd, options, sm_version, cudnn_version)
                else:
                    key = forward_graph_key(fwd, options, sm_version, cudnn_version)
            return tuple(key)
        if not libraries_loaded():
            with nogil:  # bad input is reported even where cuDNN is missing
                problem = validate_backward(bwd) if backward else validate_forward(fwd)
            ensure_libraries()
        with nogil:
            call = prepare_backward(bwd, options) if backward else prepare_forward(fwd, options)
        if call.workspace_bytes > 0 and workspace_allocator is not None:
            workspace_address, owner = workspace_allocator(call.workspace_bytes, call.problem.device)
            keep_alive.append(owner)
            workspace = <void*>workspace_address
        with nogil:
            for i in range(repeats):
                execute(call, st.handle, workspace)
    finally:
        release(owned, n)


def sdpa_forward(q, k, v, out, *, lse=None, scale=None, causal=False,
                 causal_alignment="top_left", stream=None):
    """Scaled-dot-product attention forward, written into ``out`` (and ``lse``) in place.

    ``out = softmax(scale * q @ k^T + mask) @ v`` for every batch and query head, computed by
    cuDNN's fused kernels from the tensors' real strides: views into packed buffers need no copy.

    Args:
        q: (batch, h_q, s_q, d_qk) query. Any DLPack tensor (torch, CuPy, JAX, ...) on a CUDA
            device, float16 or bfloat16. Logical axes are fixed; memory order is given by strides
            alone (a bshd tensor ``x`` is passed as ``x.transpose(1, 2)``).
        k: (batch, h_kv, s_kv, d_qk) keys; h_q must be a multiple of h_kv (GQA; MQA: h_kv = 1).
        v: (batch, h_kv, s_kv, d_v) values.
        out: (batch, h_q, s_q, d_v) output, written in place; any strides satisfying the rules below.
        lse: optional float32 (batch, h_q, s_q) (or with a trailing axis of 1) output receiving the
            natural-log log-sum-exp of each row of scaled, masked scores (what the backward needs).
        scale: score scale; ``1 / sqrt(d_qk)`` when None.
        causal: mask keys after the query position.
        causal_alignment: ``"top_left"``: query i sees keys j <= i. ``"bottom_right"``: query i sees
            keys j <= i + s_kv - s_q (the last query sees every key; for decoding with a KV cache).
        stream: a ``cudaStream_t`` as an int, or any object with ``__cuda_stream__``. When None, q
            decides: the call runs on its producer's current stream where the DLPack C exchange
            API reports it (torch) and on CuPy's current stream for a CuPy array, else on the
            legacy default stream; producers on another stream are ordered before the call
            through ``__dlpack__(stream=...)``.

    Rules (checked before anything runs; a failure raises LayoutError naming the tensor, axis,
    value and fix, and writes nothing): one CUDA device; one dtype for q, k, v, out; head_dim
    stride 1; no negative or zero strides on axes with extent > 1; every pointer and every stride
    (in bytes) of such an axis a multiple of 16; out and lse writable and sharing no memory with
    each other or any input. Axes of extent 1 may carry any stride. Configurations cuDNN cannot run
    raise UnsupportedError with cuDNN's reason; a missing or failing cuDNN/CUDA raises BackendError.

    Example::

        qkv = torch.randn(2, 128, 3, 8, 64, device="cuda", dtype=torch.bfloat16)  # packed [b,s,3,h,d]
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))               # views, no copy
        out = torch.empty(2, 128, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        stridedfa.sdpa_forward(q, k, v, out, causal=True)
    """
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    run(False, (q, k, v, out, lse), options, stream, None)


def sdpa_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, *, scale=None,
                  causal=False, causal_alignment="top_left", stream=None):
    """Gradients of :func:`sdpa_forward`, written into ``grad_q``, ``grad_k``, ``grad_v`` in place.

    Args:
        q, k, v, out: as in the forward call that produced ``out``.
        grad_out: (batch, h_q, s_q, d_v) gradient of the loss with respect to ``out``.
        lse: the float32 statistics written by the forward. cuDNN before 9.26 reads them as a packed
            (batch, h_q, s_q) array; other strides are rejected there with UnsupportedError.
        grad_q, grad_k, grad_v: outputs shaped like q, k, v, with any valid strides (e.g. the
            three slices of one packed gradient buffer). With GQA, grad_k and grad_v receive the sum
            over the query heads sharing each kv head.
        scale, causal, causal_alignment, stream: as in :func:`sdpa_forward`; use the forward's values.

    The same rules as the forward apply; the gradients must not overlap each other or any input.
    """
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    run(True, (q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v), options, stream, None)


def _forward(q, k, v, out, lse, scale, causal, causal_alignment, stream, workspace_allocator):
    """sdpa_forward for framework adapters: ``workspace_allocator(nbytes, device) -> (pointer,
    owner)`` provides cuDNN's workspace from the framework's allocator on the call's stream."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    run(False, (q, k, v, out, lse), options, stream, workspace_allocator)


def _backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, scale, causal,
              causal_alignment, stream, workspace_allocator):
    """sdpa_backward for framework adapters (see _forward)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    run(True, (q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v), options, stream,
        workspace_allocator)


def _validate_forward(q, k, v, out, lse=None, stream=None):
    """Intake and validation of a forward call, nothing else (for tests on machines without a GPU;
    the pointers are never dereferenced). Returns what validation established, or raises."""
    cdef SdpaOptions options
    return run(False, (q, k, v, out, lse), options, stream, None, VALIDATE)


def _validate_backward(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, stream=None):
    """Intake and validation of a backward call, nothing else (see _validate_forward)."""
    cdef SdpaOptions options
    return run(True, (q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v), options, stream, None,
               VALIDATE)


def _forward_graph_key(q, k, v, out, lse=None, *, scale=None, causal=False,
                       causal_alignment="top_left", sm_version=90, cudnn_version=91900):
    """The graph-cache key a forward call would use on a device with these facts (validates
    first; needs no GPU). Calls with equal keys share one cuDNN graph."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    return run(False, (q, k, v, out, lse), options, None, None, KEY, sm_version, cudnn_version)


def _backward_graph_key(q, k, v, out, grad_out, lse, grad_q, grad_k, grad_v, *, scale=None,
                        causal=False, causal_alignment="top_left", sm_version=90,
                        cudnn_version=91900):
    """The graph-cache key of a backward call (see _forward_graph_key)."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    return run(True, (q, k, v, out, lse, grad_out, grad_q, grad_k, grad_v), options, None, None,
               KEY, sm_version, cudnn_version)


def _execute_repeatedly(q, k, v, out, lse=None, *, int64_t repeats, scale=None, causal=False,
                        causal_alignment="top_left", stream=None):
    """sdpa_forward whose prepared call is executed `repeats` times back to back in C++, for the
    host-overhead benchmark's floor: per-call cost of the core's execute alone."""
    cdef SdpaOptions options
    parse_options(scale, causal, causal_alignment, &options)
    run(False, (q, k, v, out, lse), options, stream, None, RUN, 0, 0, repeats)


# --- Cache, versions, diagnostics -----------------------------------------------------------------

def cache_info():
    """Counters of the process-wide cuDNN graph cache (bounded LRU).

    Returns a dict: hits, misses, builds, build_failures, evictions, size, maxsize and
    build_seconds (summed wall time of all graph builds). Its capacity is read once from
    ``STRIDEDFA_GRAPH_CACHE_SIZE`` (default 256). Also the memory stridedfa's own stream-ordered
    pools hold (workspaces of calls that pass none, DeviceBuffer outputs): pool_reserved_bytes
    (mapped now, all devices), pool_used_bytes (handed out now) and pool_retain_bytes (what each
    device's pool keeps mapped across synchronisations at most, from
    ``STRIDEDFA_POOL_RETAIN_BYTES``, default 512 MiB).
    """
    cdef CacheStats s = graph_cache().stats()
    cdef PoolStats p = pool_stats()
    return {"hits": s.hits, "misses": s.misses, "builds": s.builds,
            "build_failures": s.build_failures, "evictions": s.evictions, "size": s.size,
            "maxsize": s.capacity, "build_seconds": s.build_seconds,
            "pool_reserved_bytes": p.reserved_bytes, "pool_used_bytes": p.used_bytes,
            "pool_retain_bytes": p.retain_bytes}


def _own_workspace_allocations():
    """How many workspaces the core allocated itself (from its pool) because a call gave none;
    adapters always pass one from their framework's allocator."""
    return own_workspace_allocations()


def cache_clear():
    """Drops every cached graph, resets the counters and gives the unused memory of stridedfa's
    pools back to the driver."""
    graph_cache().clear()
    trim_pools()


def _set_cache_capacity(size_t capacity):
    graph_cache().set_capacity(capacity)


def _compiled_versions():
    """Versions of what the extension was compiled against, as integers."""
    return {"cudnn_frontend": compiled_frontend_version(), "cudnn": compiled_cudnn_version(),
            "cuda": compiled_cuda_version()}


def _load_libraries():
    """Loads cuDNN and the CUDA runtime now (normally done by the first call)."""
    ensure_libraries()


def _runtime_versions():
    """cuDNN, CUDA runtime and driver versions of the loaded libraries (loads them if needed)."""
    ensure_libraries()
    return {"cudnn": cudnn_runtime_version(), "cuda_runtime": cuda_runtime_version(),
            "cuda_driver": cuda_driver_version()}


def _devices():
    """[(ordinal, name, compute capability (major, minor))] of the visible CUDA devices."""
    ensure_libraries()
    cdef int n = device_count()
    cdef int i
    result = []
    for i in range(n):
        info = &device_info(i)
        result.append((i, info.name.decode("utf-8", "replace"), divmod(info.sm_version, 10)))
    return result


def _can_read(x):
    """Whether cuDNN can read ``x`` as an attention input as it lies (the validator's stride and
    alignment rules); adapters copy a gradient autograd hands over only when this is False."""
    cdef TensorView view
    cdef Owned owned
    cdef CallStream st
    owned.versioned = NULL
    owned.legacy = NULL
    parse_stream(None, &st)
    try:
        intake(x, b"x", False, &st, &view, &owned)
        return view.device_type == kDLCUDA and cudnn_can_read(view)
    finally:
        release(&owned, 1)


def _inspect_dlpack(obj, stream=None):
    """How intake reads ``obj``, for tests and debugging: a dict of what the core would see.
    Unlike the calls, host arrays are read too (through ``__dlpack__()`` with no stream)."""
    cdef TensorView view
    cdef Owned owned
    cdef CallStream st
    owned.versioned = NULL
    owned.legacy = NULL
    parse_stream(stream, &st)
    try:
        device = getattr(obj, "__dlpack_device__", None)
        on_host = device is not None and device()[0] != kDLCUDA
        if on_host and exchange_api_of(type(obj)) == NULL:
            consume_capsule(call_dlpack(obj, None, b"x"), b"x", &view, &owned)
            path = "protocol"
        else:
            intake(obj, b"x", False, &st, &view, &owned)
            if owned.versioned != NULL or owned.legacy != NULL:
                path = "protocol"
            elif exchange_api_of(type(obj)) != NULL:
                path = "exchange_api"
            else:
                path = "cupy_attributes"
        capsule = ("versioned" if owned.versioned != NULL else
                   "legacy" if owned.legacy != NULL else "borrowed")
        return {
            "shape": tuple(view.dims[i] for i in range(view.ndim)),
            "strides": tuple(view.strides[i] for i in range(view.ndim)),
            "dtype": dtype_name(view.dtype).decode(),
            "device": (view.device_type, view.device_id),
            "data": view.data,
            "read_only": view.read_only,
            "path": path,
            "capsule": capsule,
            "stream": st.handle if st.decided else None,
        }
    finally:
        release(&owned, 1)


include "_framework_alloc.pxi"
include "_buffer.pxi"
include "_cupy_calls.pxi"
include "_jax_ffi.pxi"
