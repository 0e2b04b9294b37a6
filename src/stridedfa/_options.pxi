# Included by _core.pyx: the one parse of a call's options into the core's SdpaOptions (every entry
# point goes through parse_options; the torch operators' window ints and JAX's static options are
# read by _window_bounds).


cdef int64_t window_bound(object bound, const char* side) except -2:
    if bound is None:
        return -1  # SdpaOptions::kUnbounded
    # A Python or NumPy integer (JAX callers pass NumPy's); never a bool, whatever its kind.
    if (isinstance(bound, bool) or type(bound).__name__ in ("bool_", "bool")
            or not hasattr(type(bound), "__index__")):
        raise TypeError(f"window {side.decode()} bound must be an int >= 0 or None, got {bound!r}")
    bound = bound.__index__()
    if bound < 0:
        raise ValueError(f"window {side.decode()} bound must be >= 0 (None: unbounded; FlashAttention's -1 is "
                         f"None here), got {bound}")
    if bound >= 2**31 - 1:
        raise ValueError(f"window {side.decode()} bound must be below 2**31 - 1 tokens (None: unbounded), got {bound}")
    return bound


def _window_bounds(window):
    """The one parse of ``window=(left, right)`` (None sides unbounded): (left, right) as ints, -1
    for an unbounded side, or (-1, -1) for None. parse_options and the adapters (the torch
    operators' two ints, JAX's static options) all read it here."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be None or a pair (left, right) of token counts (each an int "
                        f"or None), got {window!r}")
    return window_bound(window[0], b"left"), window_bound(window[1], b"right")


cdef bint is_number(object value):
    """A real number of any producer's kind (Python, NumPy, a 0-d array), never a bool (NumPy's is
    numpy.bool_, named "bool" since NumPy 2) or a string."""
    cdef type kind = type(value)
    if kind is float or kind is int:  # what nearly every call passes: answered without a lookup
        return True
    return kind is not bool and kind.__name__ not in ("bool_", "bool") and hasattr(kind, "__float__")


cdef int parse_options(object scale, object causal, object causal_alignment, object window,
                       object softcap, object deterministic, object dropout_p, SdpaOptions* options) except -1:
    """The one parse of a call's options (every entry point goes through it)."""
    if scale is None:
        options.has_scale = False
    else:
        if not is_number(scale):
            raise TypeError(f"scale must be a number or None, got {type(scale).__name__}")
        options.has_scale = True
        options.scale = float(scale)
    options.causal = bool(causal)
    if causal_alignment == "top_left":
        options.alignment = CausalAlignment.top_left
    elif causal_alignment == "bottom_right":
        options.alignment = CausalAlignment.bottom_right
    else:
        raise ValueError(f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}")
    options.window_left, options.window_right = _window_bounds(window)
    options.deterministic = bool(deterministic)
    if softcap is None:
        options.softcap = 0.0
    else:
        if not is_number(softcap):
            raise TypeError(f"softcap must be a number or None, got {type(softcap).__name__}")
        options.softcap = float(softcap)
        if not 1.1754943508222875e-38 <= options.softcap <= 3.4028234663852886e38:  # a float32 > 0
            raise ValueError(f"softcap must be a positive finite float32 (None: no cap), got {softcap!r}")
    if not is_number(dropout_p):
        raise TypeError(f"dropout_p must be a number in [0, 1), got {type(dropout_p).__name__}")
    options.dropout_p = float(dropout_p)
    if not 0.0 <= options.dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a probability in [0, 1), got {dropout_p!r}")
    return 0


cdef int parse_max_seqlen(object max_seqlen_q, object max_seqlen_kv, SdpaOptions* options) except -1:
    """A variable-length call's promised longest sequences (None: bounded by the token count)."""
    cdef int side
    cdef int64_t values[2]
    if max_seqlen_q is None and max_seqlen_kv is None:  # every dense call: nothing to loop over
        options.max_seqlen_q = options.max_seqlen_kv = 0
        return 0
    for side, value in enumerate((max_seqlen_q, max_seqlen_kv)):
        if value is None:
            values[side] = 0
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            if hasattr(value, "__index__") and not isinstance(value, bool):
                value = value.__index__()
            else:
                raise TypeError(f"max_seqlen_{'q' if side == 0 else 'kv'} must be a Python int or None (a tensor "
                                f"would need a host synchronisation), got {type(value).__name__}")
        if value < 1 or value >= 2**31:
            raise ValueError(f"max_seqlen_{'q' if side == 0 else 'kv'} must be in [1, 2**31) or None, got {value}")
        values[side] = value
    options.max_seqlen_q, options.max_seqlen_kv = values[0], values[1]
    return 0


def _sdpa_options(scale=None, causal=False, causal_alignment="top_left", window=None, softcap=None,
                  deterministic=False, dropout_p=0.0, max_seqlen_q=None, max_seqlen_kv=None):
    """The one parse of a call's options, as the core's SdpaOptions fields by name (option_fields,
    sdpa_types.hpp): bool, float or int values. stridedfa.jax sends them as its handlers' `options`
    attribute, which the handlers decode with the same field list."""
    cdef SdpaOptions options
    cdef vector[OptionField] listed
    cdef OptionField field
    parse_options(scale, causal, causal_alignment, window, softcap, deterministic, dropout_p, &options)
    parse_max_seqlen(max_seqlen_q, max_seqlen_kv, &options)
    listed = option_fields(options)
    fields = {}
    for i in range(listed.size()):
        field = listed[i]
        name = field.name.decode()
        if field.type == c'd':
            fields[name] = field.real
        elif field.type == c'b':
            fields[name] = field.integer != 0
        else:
            fields[name] = field.integer
    return fields
