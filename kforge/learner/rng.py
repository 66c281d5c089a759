"""Seeded dropout masks: the same seed gives the same masks, without disturbing the global RNG."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def mix_seed(seed: int | None, k: int) -> int | None:
    """A seed per (parent seed, index); None stays None (no dropout: no seeding)."""
    return None if seed is None else (seed * 1_000_003 + k + 1) % (2**31 - 1)


@contextmanager
def dropout_masks(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run a forward pass under ``seed`` without disturbing the global RNG (same seed, same masks).
    Gradient checkpointing restores the RNG state it saw, so the recomputation draws them again."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
