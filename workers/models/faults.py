"""Fault injection for tests (``INFERQ_FAULT_OOM_ABOVE_TOKENS``), shared by the models."""

from __future__ import annotations

import torch


def inject_oom(limit: int, rows: int, width: int) -> None:
    """Raise the allocator's out-of-memory error when rows x width exceeds ``limit``
    (0: off), as a forward pass over that many tokens would on a small device."""
    if limit and rows * width > limit:
        raise torch.OutOfMemoryError(f"injected: {rows} x {width} tokens is over {limit}")
