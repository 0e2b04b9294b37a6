"""The core's process switches (stridedfa._core._decode_graphs, _decode_by_tokens, _split_kv, ...:
called with no argument they read the setting, with one they set it) set for a block of code."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def switched(switch, value):
    """``switch`` set to ``value`` inside the block, as it was after."""
    before = switch()
    switch(value)
    try:
        yield
    finally:
        switch(before)
