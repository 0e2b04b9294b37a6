# Included by _core.pyx: the graph cache's and the pools' counters, versions, devices, and how
# intake reads a tensor (for tests and debugging).

def cache_info():
    """Counters of the process-wide cuDNN graph cache (bounded LRU).

    Returns a dict: hits, misses, builds, build_failures, evictions, size, maxsize and
    build_seconds (summed wall time of all graph builds). Its capacity is read once from
    ``STRIDEDFA_GRAPH_CACHE_SIZE`` (default 256). Also the memory stridedfa's own stream-ordered
    pools hold (workspaces of calls that pass none, DeviceBuffer outputs): pool_reserved_bytes
    (mapped now, all devices), pool_used_bytes (handed out now) and pool_retain_bytes (what each
    device's pool keeps mapped across synchronisations at most, from
    ``STRIDEDFA_POOL_RETAIN_BYTES``, default 512 MiB).

    ``persistent`` describes the persisted execution plans, which a new process loads instead of
    building a graph again (a miss that loads a plan still counts as a build, and its time as
    build time): directory (``STRIDEDFA_CACHE_DIR``, else ``$XDG_CACHE_HOME/stridedfa/plans``, else
    ``~/.cache/stridedfa/plans``; None when ``STRIDEDFA_PERSISTENT_CACHE=0``), max_bytes (the
    bound on its plan files, ``STRIDEDFA_CACHE_MAX_BYTES``, default 1 GiB), files and bytes (now
    in it), and this process's loads, load_rejections (files found but not trusted: truncated,
    corrupt, written for another key, cuDNN, GPU or driver -- removed and built again), saves,
    save_failures (the directory could not be written; calls go on without) and evictions.

    ``transformers`` (once ``stridedfa.transformers`` is imported): its ``stats()``, the calls served
    and those that fell back to transformers' own attention, by reason.
    """
    cdef CacheStats s = graph_cache().stats()
    cdef PoolStats p = pool_stats()
    info = {"hits": s.hits, "misses": s.misses, "builds": s.builds,
            "build_failures": s.build_failures, "evictions": s.evictions, "size": s.size,
            "maxsize": s.capacity, "build_seconds": s.build_seconds,
            "pool_reserved_bytes": p.reserved_bytes, "pool_used_bytes": p.used_bytes,
            "pool_retain_bytes": p.retain_bytes, "persistent": store_info(plan_store())}
    integration = sys.modules.get("stridedfa.transformers")
    if integration is not None:
        info["transformers"] = integration.stats()
    return info


cdef dict store_info(PlanStore& store):
    cdef PlanStoreStats s = store.stats()
    cdef int64_t files = 0, nbytes = 0
    store.usage(&files, &nbytes)
    return {"directory": store.directory().decode() if store.enabled() else None,
            "max_bytes": store.max_bytes(), "files": files, "bytes": nbytes, "loads": s.loads,
            "load_rejections": s.load_rejections, "saves": s.saves, "save_failures": s.save_failures,
            "evictions": s.evictions}


def _own_workspace_allocations():
    """How many workspaces the core allocated itself (from its pool) because a call gave none;
    adapters always pass one from their framework's allocator."""
    return own_workspace_allocations()


def cache_clear(persistent=False):
    """Drops every cached graph, resets the counters and gives the unused memory of stridedfa's
    pools back to the driver. With ``persistent=True`` also removes every persisted plan from
    the directory ``cache_info()["persistent"]`` names (other processes then build again)."""
    graph_cache().clear()
    trim_pools()
    if persistent:
        plan_store().clear()


def _set_cache_capacity(size_t capacity):
    graph_cache().set_capacity(capacity)


def _decode_graphs(bucketed=None):
    """Whether decoding calls get graphs a growing cache reuses (decoding by heads, a paged table's
    bucketed width) rather than graphs of their exact extents; with ``bucketed`` set it first (for
    tests and benchmarks; the process default is STRIDEDFA_DECODE_GRAPHS: bucketed, the default,
    ragged, or exact)."""
    if bucketed is not None:
        set_decode_graphs_bucketed(bool(bucketed))
    return decode_graphs_bucketed()


def _decode_heads_paged(paged=None):
    """Whether a one-query decoding step over a head-major cache is described by heads through a
    paged view of the cache (cuDNN's fast one-query kernel; the default since GPU run 66) rather
    than the ragged form (STRIDEDFA_DECODE_GRAPHS=ragged); with ``paged`` set it first (for tests
    and benchmarks)."""
    if paged is not None:
        set_decode_heads_paged(bool(paged))
    return decode_heads_paged()


def _decode_by_tokens(enabled=None):
    """Whether a paged step of 2-4 queries per sequence (2-8 for one; causal bottom-right, or unmasked) runs as
    one-query sequences, one per token (cuDNN's fast one-query kernel; on by default); with
    ``enabled`` set it first (for tests and benchmarks)."""
    if enabled is not None:
        set_decode_by_tokens(bool(enabled))
    return decode_by_tokens()


def _decode_prefix_tail(enabled=None):
    """Whether a paged causal (bottom-right) step of several queries per sequence over a cache of >= 2048
    keys (5-8 at batch >= 2, 3-8 at batch >= 32) runs as a prefix every token sees (the tokens folded
    into the heads: cuDNN's fast one-query kernel reads the keys once) and a short tail per token,
    merged by their log-sum-exp (on by default); with ``enabled`` set it first (for tests and
    benchmarks)."""
    if enabled is not None:
        set_decode_prefix_tail(bool(enabled))
    return decode_prefix_tail()


def _decode_prefix_tail_rows(enabled=None):
    """Whether that split describes each key head's group x tokens as cuDNN's query rows (its general
    kernel reads the keys once per group; the prefix cut into chunks; then 3-16 queries at any batch)
    rather than as heads of one query (GPU run 74's probe74; off until a GPU run checks it against the reference); with
    ``enabled`` set it first (for tests and benchmarks)."""
    if enabled is not None:
        set_decode_prefix_tail_rows(bool(enabled))
    return decode_prefix_tail_rows()


def _split_kv(enabled=None, chunks=None):
    """Whether paged decoding calls may be split over their keys and merged by their log-sum-exp
    (split_kv.hpp); with ``enabled`` set it first (for tests and benchmarks; the process default is
    STRIDEDFA_SPLIT_KV=auto or off, the default). ``chunks``: cut every split-able call into that
    many chunks (at most one per block of its table; 1: never split), 0 for the heuristic's choice
    (benchmarks' sweeps, which tune the heuristic)."""
    if enabled is not None:
        set_split_kv_enabled(bool(enabled))
    if chunks is not None:
        set_split_kv_chunks(int(chunks))
    return split_kv_enabled()


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


def _inspect_dlpack(obj, stream=None):
    """How intake reads ``obj``, for tests and debugging: a dict of what the core would see.
    Unlike the calls, host arrays are read too (through ``__dlpack__()`` with no stream)."""
    cdef TensorView view
    cdef IntakeHold owned  # each consumed tensor's deleter runs when this returns
    cdef CallStream st
    parse_stream(stream, &st)
    device = getattr(obj, "__dlpack_device__", None)
    on_host = device is not None and device()[0] != kDLCUDA
    if on_host and exchange_api_of(type(obj)) == NULL:
        consume_capsule(call_dlpack(obj, None, b"x"), b"x", &view, &owned[0])
        path = "protocol"
    else:
        intake(obj, b"x", False, &st, &view, &owned[0])
        if owned[0].versioned != NULL or owned[0].legacy != NULL:
            path = "protocol"
        elif exchange_api_of(type(obj)) != NULL:
            path = "exchange_api"
        else:
            path = "cupy_attributes"
    capsule = ("versioned" if owned[0].versioned != NULL else
               "legacy" if owned[0].legacy != NULL else "borrowed")
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


def _quirk_applies(str name, int64_t cudnn_version=0):
    """Whether stridedfa refuses or works around the cuDNN quirk ``name`` (a row of
    cpp/include/stridedfa/cudnn_quirks.hpp) on cuDNN ``cudnn_version`` (0: not known): what an
    adapter asks, once at import, instead of restating the rule."""
    return quirk_applies_named(name.encode(), cudnn_version)
