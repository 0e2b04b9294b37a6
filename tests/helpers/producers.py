"""A DLPack producer stridedfa has no adapter for, wrapping a real array (torch, CuPy, ...)."""


class Producer:
    """Any DLPack producer stridedfa has no adapter for: only the protocol, nothing else."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()
