"""Type stubs for stridedfa._core, the compiled boundary (Cython over the C++ core).

Tensors are typed ``Any``: every DLPack producer is accepted (torch, CuPy, JAX, NumPy on the host
for validation, hand-made producers), and what each path needs is checked at run time.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol

class _CudaStream(Protocol):
    def __cuda_stream__(self) -> tuple[int, int]: ...

Stream = int | _CudaStream | None
Shape = tuple[int, ...]
Window = tuple[int | None, int | None] | list[int | None] | None  # (left, right) in tokens

# --- Public (re-exported by stridedfa) -------------------------------------------------------------

class DeviceBuffer:
    """A strided CUDA array owned by stridedfa, exported by DLPack."""

    @property
    def shape(self) -> Shape: ...
    @property
    def strides(self) -> Shape: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def stream(self) -> int: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object: ...

def sdpa_forward(q: Any, k: Any, v: Any, out: Any, *, lse: Any = None, scale: float | None = None,
                 causal: bool = False, causal_alignment: str = "top_left", window: Window = None,
                 softcap: float | None = None,
                 seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                 alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                 stream: Stream = None, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                 max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                 block_table: Any = None) -> None: ...
def sdpa_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any, grad_q: Any, grad_k: Any,
                  grad_v: Any, *, scale: float | None = None, causal: bool = False,
                  causal_alignment: str = "top_left", window: Window = None, softcap: float | None = None,
                  seqlens_q: Any = None,
                  seqlens_kv: Any = None, sinks: Any = None, grad_sinks: Any = None, bias: Any = None,
                  grad_bias: Any = None, alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                  deterministic: bool = False,
                  stream: Stream = None, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                  max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None) -> None: ...
def cache_info() -> dict[str, Any]: ...
def cache_clear(persistent: bool = False) -> None: ...

# --- For stridedfa's own modules and tests --------------------------------------------------------

# Allocation strategies of the one call path (_allocators.pxi): made and used in C only.
class Outputs: ...
class FrameworkOutputs(Outputs): ...
class PackedOutputs(FrameworkOutputs): ...
class CupyOutputs(Outputs): ...
class BufferOutputs(Outputs): ...


WorkspaceAllocator = Callable[[int, int], tuple[int, object]]

def _operands() -> list[dict[str, Any]]: ...
def _forward(q: Any, k: Any, v: Any, out: Any, lse: Any, scale: float | None, causal: bool,
             causal_alignment: str, stream: Stream, workspace_allocator: WorkspaceAllocator | None,
             window: Window = None, softcap: float | None = None, seqlens_q: Any = None,
             seqlens_kv: Any = None, sinks: Any = None, bias: Any = None, alibi_slopes: Any = None,
             dropout_p: float = 0.0, rng_state: Any = None, *, cu_seqlens_q: Any = None,
             cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
             block_table: Any = None) -> None: ...
def _backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any, grad_q: Any, grad_k: Any, grad_v: Any,
              scale: float | None, causal: bool, causal_alignment: str, stream: Stream,
              workspace_allocator: WorkspaceAllocator | None, window: Window = None, softcap: float | None = None,
              seqlens_q: Any = None,
              seqlens_kv: Any = None, sinks: Any = None, grad_sinks: Any = None,
              deterministic: bool = False, bias: Any = None, grad_bias: Any = None,
              alibi_slopes: Any = None, dropout_p: float = 0.0,
              rng_state: Any = None, *, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
              max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None) -> None: ...
def _validate_forward(q: Any, k: Any, v: Any, out: Any, lse: Any = None, stream: Stream = None, *,
                      seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                      alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                      scale: float | None = None,
                      causal: bool = False, causal_alignment: str = "top_left",
                      window: Window = None, softcap: float | None = None, cu_seqlens_q: Any = None,
                      cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None,
                      max_seqlen_kv: int | None = None, block_table: Any = None,
                      **operands: Any) -> dict[str, Any]: ...
def _validate_backward(q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any, grad_q: Any, grad_k: Any,
                       grad_v: Any, stream: Stream = None, *, seqlens_q: Any = None, seqlens_kv: Any = None,
                       sinks: Any = None, grad_sinks: Any = None, bias: Any = None, grad_bias: Any = None,
                       alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                       scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                       window: Window = None, softcap: float | None = None, deterministic: bool = False,
                       cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None,
                       max_seqlen_kv: int | None = None,
                       **operands: Any) -> dict[str, Any]: ...
def _forward_graph_key(q: Any, k: Any, v: Any, out: Any, lse: Any = None, *, scale: float | None = None,
                       causal: bool = False, causal_alignment: str = "top_left", window: Window = None,
                       softcap: float | None = None,
                       seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                       alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                       sm_version: int = 90,
                       cudnn_version: int = 91900, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                       max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                       block_table: Any = None) -> tuple[int, ...]: ...
def _backward_graph_key(q: Any, k: Any, v: Any, out: Any, grad_out: Any, lse: Any, grad_q: Any, grad_k: Any,
                        grad_v: Any, *, scale: float | None = None, causal: bool = False,
                        causal_alignment: str = "top_left", window: Window = None, softcap: float | None = None,
                        seqlens_q: Any = None,
                        seqlens_kv: Any = None, sinks: Any = None, grad_sinks: Any = None, bias: Any = None,
                        grad_bias: Any = None, alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None,
                        deterministic: bool = False, sm_version: int = 90,
                        cudnn_version: int = 91900, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                        max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None) -> tuple[int, ...]: ...
def _forward_alloc(q: Any, k: Any, v: Any, scale: float | None, causal: bool, causal_alignment: str,
                   with_lse: bool, together: bool = False, window: Window = None, softcap: float | None = None,
                   seqlens_q: Any = None,
                   seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                   alibi_slopes: Any = None, dropout_p: float = 0.0,
                   rng_state: Any = None, block_table: Any = None, *, cu_seqlens_q: Any = None,
                   cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None,
                   max_seqlen_kv: int | None = None) -> tuple[Any, Any]: ...
def _backward_alloc(q: Any, k: Any, v: Any, out: Any, lse: Any, grad_out: Any, scale: float | None, causal: bool,
                    causal_alignment: str, make_readable: Callable[[Any], Any], together: bool,
                    window: Window = None, softcap: float | None = None, seqlens_q: Any = None,
                    seqlens_kv: Any = None, sinks: Any = None,
                    deterministic: bool = False, bias: Any = None, with_grad_bias: bool = False,
                    alibi_slopes: Any = None, dropout_p: float = 0.0,
                    rng_state: Any = None, *, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                    max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                    with_grad_sinks: bool = True) -> tuple[Any, Any, Any, Any, Any]: ...
def _packed_forward_alloc(packed: Any, dim: int, to_logical: Sequence[int], q: Any, scale: float | None,
                          causal: bool, causal_alignment: str, with_lse: bool, window: Window = None,
                          softcap: float | None = None,
                          seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None,
                          bias: Any = None, alibi_slopes: Any = None, dropout_p: float = 0.0,
                   rng_state: Any = None) -> tuple[Any, Any]: ...
def _packed_backward_alloc(packed: Any, dim: int, to_logical: Sequence[int], q: Any, out: Any, lse: Any,
                           grad_out: Any, scale: float | None, causal: bool, causal_alignment: str,
                           window: Window = None, softcap: float | None = None, seqlens_q: Any = None,
                           seqlens_kv: Any = None, sinks: Any = None,
                           deterministic: bool = False, bias: Any = None, with_grad_bias: bool = False,
                           alibi_slopes: Any = None, dropout_p: float = 0.0,
                   rng_state: Any = None) -> tuple[Any, Any, Any, Any]: ...
def _attention_generic(q: Any, k: Any, v: Any, scale: float | None, causal: bool, causal_alignment: str,
                       return_lse: bool, stream: Stream, window: Window = None, softcap: float | None = None,
                       seqlens_q: Any = None,
                       seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                       alibi_slopes: Any = None, dropout_p: float = 0.0,
                   rng_state: Any = None) -> Any: ...
def _varlen_generic(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_kv: Any, max_seqlen_q: int | None,
                    max_seqlen_kv: int | None, scale: float | None, causal: bool, causal_alignment: str,
                    return_lse: bool, stream: Stream, window: Window = None, softcap: float | None = None,
                    sinks: Any = None, dropout_p: float = 0.0, rng_state: Any = None) -> Any: ...
def _cupy_forward(q: Any, k: Any, v: Any, scale: float | None, causal: bool, causal_alignment: str,
                  with_lse: bool, stream: int, allocation: Any, hooks: Any, window: Window = None,
                  softcap: float | None = None,
                  seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None, bias: Any = None,
                  alibi_slopes: Any = None, dropout_p: float = 0.0,
                  rng_state: Any = None, block_table: Any = None, cu_seqlens_q: Any = None,
                  cu_seqlens_kv: Any = None, max_seqlen_q: int | None = None,
                  max_seqlen_kv: int | None = None) -> tuple[Any, Any]: ...
def _cupy_backward(q: Any, k: Any, v: Any, out: Any, lse: Any, grad_out: Any, scale: float | None, causal: bool,
                   causal_alignment: str, stream: int, allocation: Any, hooks: Any, window: Window = None,
                   softcap: float | None = None,
                   seqlens_q: Any = None, seqlens_kv: Any = None, sinks: Any = None,
                   deterministic: bool = False, bias: Any = None, with_grad_bias: bool = False,
                   alibi_slopes: Any = None, dropout_p: float = 0.0,
                   rng_state: Any = None, cu_seqlens_q: Any = None, cu_seqlens_kv: Any = None,
                   max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                   with_grad_sinks: bool = True) -> tuple[Any, Any, Any, Any, Any]: ...
def _can_read(x: Any) -> bool: ...
def _window_bounds(window: Window) -> tuple[int, int]: ...
def _sdpa_options(scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                  window: Window = None, softcap: float | None = None, deterministic: bool = False,
                  dropout_p: float = 0.0, max_seqlen_q: int | None = None,
                  max_seqlen_kv: int | None = None) -> dict[str, bool | float | int]: ...
def _jax_ffi_targets() -> dict[str, object]: ...
def _jax_optional_operands() -> dict[str, int]: ...
def _validate_shapes(backward: bool, layout: int, shapes: tuple[Shape | None, ...], dtype: str | tuple[str, ...], *,
                  scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                  window: Window = None, softcap: float | None = None, deterministic: bool = False,
                  lengths: tuple[tuple[Shape, str], ...] | None = None,
                  sinks: tuple[Shape, str] | None = None, grad_sinks: bool = True,
                  bias: tuple[Shape, str] | None = None, grad_bias: bool = True,
                  alibi_slopes: tuple[Shape, str] | None = None, dropout_p: float = 0.0,
                  rng_state: tuple[Shape, str] | None = None,
                  cu_seqlens: tuple[tuple[Shape, str], ...] | None = None, max_seqlen_q: int | None = None,
                  max_seqlen_kv: int | None = None,
                  block_table: tuple[Shape, str] | None = None, shared_lengths: bool = False) -> dict[str, Any]: ...
def _jax_graph_key(backward: bool, layout: int, shapes: tuple[Shape | None, ...], dtype: str, *,
                   scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                   window: Window = None, softcap: float | None = None, deterministic: bool = False,
                   bias: tuple[Shape, str] | None = None, grad_bias: bool = True,
                   alibi_slopes: tuple[Shape, str] | None = None, dropout_p: float = 0.0,
                   rng_state: tuple[Shape, str] | None = None, sm_version: int = 90,
                   cudnn_version: int = 91900) -> tuple[int, ...]: ...
def _own_workspace_allocations() -> int: ...
def _set_cache_capacity(capacity: int) -> None: ...
def _compiled_versions() -> dict[str, int]: ...
def _load_libraries() -> None: ...
def _runtime_versions() -> dict[str, int]: ...
def _devices() -> list[tuple[int, str, tuple[int, int]]]: ...
def _inspect_dlpack(obj: Any, stream: Stream = None) -> dict[str, Any]: ...
def _quirk_applies(name: str, cudnn_version: int = 0) -> bool: ...

# --- Test hooks ---------------------------------------------------------------------------------

def _allocate_like(like: Any, shape: Sequence[int], strides: Sequence[int]) -> Any: ...
def _output_strides(out_shape: Sequence[int], like_strides: Sequence[int]) -> tuple[int, ...]: ...
def _gradient_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]: ...
def _execute_repeatedly(q: Any, k: Any, v: Any, out: Any, lse: Any = None, *, repeats: int,
                        scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                        stream: Stream = None) -> None: ...
def _device_buffer(shape: Sequence[int], strides: Sequence[int], dtype: str, device: int = 0,
                   stream: int = 0) -> DeviceBuffer: ...
def _cupy_allocate_like_forward(q: Any, v: Any, with_lse: bool, hooks: Any) -> tuple[Any, Any]: ...
def _cupy_allocate_gradients(q: Any, k: Any, v: Any, hooks: Any) -> tuple[Any, Any, Any]: ...
def _output_layouts(inputs: dict[str, Any], outputs: str,
                    backward: bool = False) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]] | None]: ...
def _packed_allocate(packed: Any, dim: int, to_logical: Sequence[int], q: Any,
                     backward: bool) -> tuple[Any, Any, Any, dict[str, tuple[int, tuple[int, ...]]]]: ...
def _plan_store_save(directory: str, max_bytes: int, key: Sequence[int], context: str,
                     payload: bytes) -> tuple[bool, dict[str, Any]]: ...
def _plan_store_load(directory: str, key: Sequence[int], context: str) -> tuple[bytes | None, dict[str, Any]]: ...
def _plan_store_clear(directory: str) -> int: ...
def _warm_up_shapes(backward: bool, layout: int, shapes: tuple[Any, ...], dtype: Any, device: int, *,
                    scale: float | None = None, causal: bool = False, causal_alignment: str = "top_left",
                    window: Window = None, softcap: float | None = None, deterministic: bool = False,
                    lengths: Any = None, sinks: Any = None, bias: Any = None, grad_bias: bool = False,
                    alibi_slopes: Any = None, dropout_p: float = 0.0, rng_state: Any = None, grad_sinks: bool = True,
                    cu_seqlens: Any = None, max_seqlen_q: int | None = None, max_seqlen_kv: int | None = None,
                    shared_lengths: bool = False, key_only: bool = False, sm_version: int = 90,
                    cudnn_version: int = 91900) -> tuple[int, ...] | None: ...
def _length_bucket(n: int) -> int: ...
def _decode_graphs(bucketed: bool | None = None) -> bool: ...
def _decode_heads_paged(paged: bool | None = None) -> bool: ...
def _decode_by_tokens(enabled: bool | None = None) -> bool: ...
def _decode_prefix_tail(enabled: bool | None = None) -> bool: ...
def _decode_prefix_tail_rows(enabled: bool | None = None) -> bool: ...
def _split_kv(enabled: bool | None = None, chunks: int | None = None) -> bool: ...
