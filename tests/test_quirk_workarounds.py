"""The adapters' workarounds of cuDNN quirks, each one rule (stridedfa._quirk_workarounds) that asks
the quirk table whether it still applies."""

import pytest

from stridedfa import _core, _quirk_workarounds


@pytest.mark.parametrize("h_q, h_kv, heads", [(8, 1, 2), (7, 1, 7), (1, 1, 1), (8, 2, 2), (8, 8, 8)])
def test_varlen_backward_repeats_only_mqa_heads(h_q, h_kv, heads):
    assert _core._quirk_applies("varlen_backward_mqa_dk")  # unfixed in every cuDNN known so far
    assert _quirk_workarounds.varlen_backward_kv_heads(h_q, h_kv) == heads


def test_varlen_backward_repeats_nothing_once_cudnn_fixes_it(monkeypatch):
    monkeypatch.setattr(_quirk_workarounds, "_VARLEN_BACKWARD_MQA_DK", False)
    assert _quirk_workarounds.varlen_backward_kv_heads(8, 1) == 1
