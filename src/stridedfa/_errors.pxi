# Included by _core.pyx: C++ exceptions into stridedfa errors, at one point. Every throwing
# function of the core is declared `except +raise_core_error` (_cpp.pxd); the translator below is
# what that handler calls, registered when the module is imported.

cdef int translate_core_error() except -1:
    """Turns the C++ exception in flight into the stridedfa exception of the same kind."""
    cdef string message
    cdef ErrorKind kind = classify_current_exception(message)
    text = message.decode("utf-8", "replace")
    if kind == ErrorKind.bounds:
        raise BoundsError(text)
    if kind == ErrorKind.layout:
        raise LayoutError(text)
    if kind == ErrorKind.unsupported:
        raise UnsupportedError(text)
    if kind == ErrorKind.backend:
        raise BackendError(text)
    raise StridedFAError("internal error in the stridedfa core: " + text)


set_error_translator(translate_core_error)
