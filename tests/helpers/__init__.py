"""Shared test helpers (layout builders, references, checks).

``helpers.cuda`` imports nothing heavy; the other modules import torch at import time,
so GPU test modules import them only after ``helpers.cuda.require_cuda()``.
"""
