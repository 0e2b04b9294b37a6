"""The workarounds of cuDNN quirks (cpp/include/stridedfa/cudnn_quirks.hpp) that the framework
adapters carry out, because they need the framework's own operations: each rule lives here once,
and asks the quirk table whether it still applies, so a cuDNN that fixes the quirk (its row's
fixed_in) ends the workaround everywhere. Plain Python on ints, which torch.compile traces and JAX
runs while tracing; no framework imported."""

from __future__ import annotations

from stridedfa import _core

# Asked once: constants while tracing.
_VARLEN_BACKWARD_MQA_DK = _core._quirk_applies("varlen_backward_mqa_dk")

# cuDNN quirk varlen_backward_dense_queries: a variable-length backward computes dQ right only from
# a dense token-major q (the core refuses another): an adapter copies q for the backward.
VARLEN_BACKWARD_DENSE_QUERIES = _core._quirk_applies("varlen_backward_dense_queries")

# cuDNN quirk sinks_grad_under_dropout: the sinks' gradient under dropout is wrong (the core
# computes none): the torch adapter refuses trainable sinks with dropout before the forward.
SINKS_GRAD_UNDER_DROPOUT = _core._quirk_applies("sinks_grad_under_dropout")


def varlen_backward_kv_heads(h_q, h_kv):
    """How many key/value heads a variable-length call that will be differentiated must give
    cuDNN (cuDNN quirk varlen_backward_mqa_dk: one key/value head serving several query heads gets
    a wrong dK, and the core refuses it). MQA's one head is repeated to two (grouped heads,
    verified right) where two divide the query heads, else to as many as those, and the adapter
    sums the repeated heads' gradients back into the one (autograd does for torch and JAX). h_kv
    itself where nothing is to be repeated."""
    if _VARLEN_BACKWARD_MQA_DK and h_kv == 1 and h_q > 1:
        return 2 if h_q % 2 == 0 else h_q
    return h_kv
