"""The exceptions stridedfa raises. Every failure of a call is one of these, raised before anything
is launched when the inputs are at fault."""

__all__ = ["StridedFAError", "LayoutError", "BoundsError", "UnsupportedError", "BackendError"]


class StridedFAError(Exception):
    """Base class of every stridedfa error."""


class LayoutError(StridedFAError, ValueError):
    """A tensor cannot be used as given: device, dtype, shape, stride, alignment or aliasing.

    The message names the tensor, the axis, the offending value and the fix. Nothing was written.
    """


class BoundsError(LayoutError, RuntimeError):
    """Sequence lengths, cu_seqlens offsets or block ids (values on the device) that lie outside the
    tensors they index. Found where a check was asked for -- ``STRIDEDFA_CHECK_BOUNDS=1`` in the
    core, and the FlashAttention interface's paged bounds, which FlashAttention's callers rely on
    -- instead of being clamped on the device. A RuntimeError too, as FlashAttention raises there.
    """


class UnsupportedError(StridedFAError, ValueError):
    """The tensors are well formed but this configuration cannot run (cuDNN's reason included)."""


class BackendError(StridedFAError, RuntimeError):
    """cuDNN or the CUDA runtime is missing, too old, or failed."""
