# Included by _core.pyx: DLPack intake. Each argument is read once, without copying, into the
# core's TensorView, fastest path first: the DLPack C exchange API (torch >= 2.10), CuPy's own
# attributes, then __dlpack__ capsules (versioned or legacy, consumed by the protocol's rules).

# What intake does with a producer's arrays, decided once per type.
cdef enum ProducerKind:
    generic_producer = 0  # __dlpack__ (or the exchange API, where its type has one)
    cupy_ndarray = 1      # read from its attributes (intake_cupy)
    cupy_other = 2        # CuPy's __dlpack__, with its negative-stride quirk
    jax_array = 3         # immutable: read-only when passed as an output

cdef dict _producers = {}  # type -> (address of its DLPackExchangeAPI or 0, ProducerKind); keeps types alive


cdef tuple producer_of(type tp):
    info = _producers.get(tp)
    if info is None:
        address = 0
        capsule = getattr(tp, "__dlpack_c_exchange_api__", None)
        if capsule is not None and PyCapsule_IsValid(capsule, b"dlpack_exchange_api"):
            api = <const DLPackExchangeAPI*>PyCapsule_GetPointer(capsule, b"dlpack_exchange_api")
            if api.header.version.major == DLPACK_MAJOR_VERSION:
                address = <uintptr_t>api
        kind = ProducerKind.generic_producer
        if is_cupy_type(tp):
            kind = ProducerKind.cupy_ndarray if tp.__name__ == "ndarray" else ProducerKind.cupy_other
        elif tp.__module__.startswith(("jax", "jaxlib")):
            kind = ProducerKind.jax_array
        info = _producers[tp] = (address, kind)
    return info


cdef const DLPackExchangeAPI* exchange_api_of(type tp) except? NULL:
    return <const DLPackExchangeAPI*><uintptr_t>producer_of(tp)[0]


# What intake borrowed from DLPack producers for one call: each consumed tensor's managed struct,
# whose deleter must run exactly once. A call's IntakeHold is a local of the function that makes
# the call, so the deleters run when it returns or raises -- no release on every path. A deleter
# may be Python code (a producer written in Python): the error a raising call has set is kept
# aside while it runs, as a `finally:` block would.
cdef extern from *:
    """
    struct StridedfaOwned {
      DLManagedTensorVersioned* versioned = nullptr;
      DLManagedTensor* legacy = nullptr;
      void release() noexcept {  // calls the deleter, once
        if (versioned == nullptr && legacy == nullptr) return;
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (versioned != nullptr && versioned->deleter != nullptr) versioned->deleter(versioned);
        if (legacy != nullptr && legacy->deleter != nullptr) legacy->deleter(legacy);
        versioned = nullptr;
        legacy = nullptr;
        PyErr_Restore(type, value, traceback);
      }
    };
    class StridedfaIntakeHold {  // the tensors of one call, by the call's own numbering
     public:
      StridedfaIntakeHold() = default;
      StridedfaIntakeHold(const StridedfaIntakeHold&) = delete;
      StridedfaIntakeHold& operator=(const StridedfaIntakeHold&) = delete;
      ~StridedfaIntakeHold() { for (StridedfaOwned& o : items_) o.release(); }
      StridedfaOwned& operator[](int i) noexcept { return items_[i]; }
     private:
      // every operand slot, and a few more for what the packed calls read in their layout
      StridedfaOwned items_[stridedfa::kNumSlots + 4];
    };
    """
    cdef cppclass Owned "StridedfaOwned":
        DLManagedTensorVersioned* versioned
        DLManagedTensor* legacy
        void release() noexcept

    cdef cppclass IntakeHold "StridedfaIntakeHold":
        Owned& operator[](int) noexcept


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
    # CuPy's bfloat16 arrays carry ml_dtypes' NumPy dtype; without this entry they took the
    # protocol path, ~3 us more per array (GPU run 29).
    try:
        import ml_dtypes
        _cupy_dtypes[numpy.dtype(ml_dtypes.bfloat16)] = (4, 16)
    except ImportError:
        pass
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
    # Typed tuples and C integers: this loop runs per axis of every array of every call, and
    # Python-object arithmetic here cost more than all of CuPy's attribute reads together.
    cdef tuple dims = obj.shape
    cdef tuple byte_strides = obj.strides
    cdef int64_t byte_stride
    ndim = len(dims)
    if ndim > 8:
        return 0  # the protocol path reports it
    t.dtype.code = code_bits[0]
    t.dtype.bits = code_bits[1]
    t.dtype.lanes = 1
    itemsize = t.dtype.bits // 8
    for i in range(ndim):
        shape[i] = dims[i]
        byte_stride = byte_strides[i]
        if byte_stride % itemsize != 0:
            raise LayoutError(f"{name.decode()}: axis {i} has a stride of {byte_stride} bytes, not a "
                              f"multiple of its {itemsize}-byte elements; pass a copy "
                              f"(cupy.ascontiguousarray(x))")
        strides[i] = byte_stride // itemsize
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


cdef int intake(object obj, const char* name, cbool is_output, CallStream* st,
                TensorView* view, Owned* owned) except -1:
    """Reads one argument into `view` without copying; decides the call's stream if still open."""
    cdef type tp = type(obj)
    cdef tuple producer = producer_of(tp)
    cdef const DLPackExchangeAPI* api = <const DLPackExchangeAPI*><uintptr_t>producer[0]
    cdef int kind = producer[1]
    cdef cbool from_cupy = kind == ProducerKind.cupy_ndarray or kind == ProducerKind.cupy_other
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
        owned.release()
        view.present = False
    elif from_cupy:
        if kind == ProducerKind.cupy_ndarray and intake_cupy(obj, name, st, view):
            return 0
        quirk = ExportQuirk.cupy_unsigned_strides

    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        device_type, device_id = device()
        if device_type != kDLCUDA:
            # Without a CUDA device there is no stream to pass; report it like the validator would.
            where = {1: "CPU", 3: "CUDA host (pinned) memory", 13: "CUDA managed memory", 10: "ROCm"}.get(
                device_type, f"DLPack device type {device_type}")
            raise LayoutError(
                f"{name.decode()} needs a CUDA device; it lives in {where} ({tp.__module__}."
                f"{tp.__qualname__}). Move it to the GPU first (torch: x.cuda(), CuPy: "
                f"cupy.asarray(x), JAX: jax.device_put(x, gpu)).")
    if not st.decided:
        st.decided = True
        # CuPy's current stream for CuPy arrays (what a CuPy caller expects; no cross-stream event is
        # then needed), else the legacy default stream.
        st.handle = cupy_current_stream() if from_cupy else 0
    consume_capsule(call_dlpack(obj, protocol_stream(st.handle), name), name, view, owned, quirk)
    if is_output and kind == ProducerKind.jax_array:
        view.read_only = True  # JAX arrays are immutable though their DLPack export does not say so
    return 0


def _can_read(x):
    """Whether cuDNN can read ``x`` as an attention input as it lies (the validator's stride and
    alignment rules); adapters copy a gradient autograd hands over only when this is False."""
    cdef TensorView view
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_stream(None, &st)
    intake(x, b"x", False, &st, &view, &owned[0])
    return view.device_type == kDLCUDA and cudnn_can_read(view)


# --- A call's operands, by name ---------------------------------------------------------------------
#
# An entry point names its tensor arguments once (slot_list, at import: a name that is not in the
# operand table fails there) and passes them in that order; intake_slots reads each into its slot.

cdef struct SlotList:
    int n
    int slot[64]


cdef SlotList slot_list(str names) except *:
    """The operand table's slots of these space-separated names, in their order."""
    cdef SlotList slots
    cdef int i
    slots.n = 0
    for name in names.split():
        for i in range(kNumSlots):
            if kOperands[i].name.decode() == name:
                break
        else:
            raise ValueError(f"no operand is called {name!r} (cpp/include/stridedfa/sdpa_types.hpp kOperands)")
        slots.slot[slots.n] = i
        slots.n += 1
    return slots


cdef int intake_slots(tuple tensors, const SlotList* slots, CallStream* st, CallOperands* call,
                      IntakeHold* owned) except -1:
    """Reads tensors[i] (None: not given) into the call's slot slots.slot[i]; call.op says which
    operands the op has, and one it has none of is a TypeError. owned[slot] holds what intake
    consumed."""
    cdef int i, slot
    cdef Role role
    for i in range(slots.n):
        obj = tensors[i]
        if obj is None:
            continue
        slot = slots.slot[i]
        role = kOperands[slot].backward if call.op == GraphOp.backward else kOperands[slot].forward
        if role == Role.absent:
            raise TypeError(f"the {'backward' if call.op == GraphOp.backward else 'forward'} has no operand "
                            f"{kOperands[slot].name.decode()}")
        intake(obj, kOperands[slot].name, role == Role.output, st, &call.slot[slot], &owned[0][slot])
    return 0


cdef int make_readable_grad_out(CallOperands* call, object grad_out, object make_readable, CallStream* st,
                                IntakeHold* owned, list keep_alive) except -1:
    """grad_out as autograd handed it over, unless cuDNN cannot read that layout (a broadcast from
    out.sum().backward(), say): then make_readable(grad_out), a copy, in its place."""
    cdef TensorView* view = &call.slot[kGradO]
    if not view.present or view.device_type != kDLCUDA or cudnn_can_read(view[0]):
        return 0
    owned[0][kGradO].release()
    copy = make_readable(grad_out)
    keep_alive.append(copy)
    intake(copy, b"grad_out", False, st, view, &owned[0][kGradO])
    return 0
