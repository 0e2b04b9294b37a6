"""Shared test setup: `helpers` importable, the `gpu` marker skipping cleanly without a usable GPU,
and the versions under test printed in the report header."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@functools.cache
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device and cuDNN are usable, else why not."""
    import stridedfa

    report = stridedfa.info()
    devices = report.get("devices")
    if isinstance(devices, dict):
        return f"no usable GPU: {devices['error']}"
    if not devices:
        return "no CUDA device is visible"
    return None


def pytest_report_header(config):
    try:
        import stridedfa

        report = stridedfa.info()
    except Exception as error:  # the header must never break the run
        return [f"stridedfa: not importable ({error})"]
    lines = [f"stridedfa {report['stridedfa']}, built with {report['built_with']}"]
    for key in ("cudnn", "cuda_runtime", "cuda_driver", "devices"):
        lines.append(f"  {key}: {report.get(key)}")
    try:
        import torch

        lines.append(f"  torch {torch.__version__} (cuda {torch.version.cuda}, "
                     f"cudnn {torch.backends.cudnn.version() if torch.cuda.is_available() else 'n/a'})")
    except ImportError:
        lines.append("  torch: not installed")
    return lines


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for item in gpu_items:
            item.add_marker(skip)
