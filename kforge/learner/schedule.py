"""Learning-rate schedule: linear warm-up, then constant, linear decay or cosine decay to zero."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(step: int, warmup: int, total: int | None, schedule: str) -> float:
    """Multiplier of the base learning rate at optimiser step ``step`` (0-based)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if total is None:
        raise ValueError(f"learner.lr_schedule={schedule} needs the number of steps: set max_steps")
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"learner.lr_schedule {schedule!r} is unknown; use constant, linear or cosine")


def make_scheduler(optimizer: Optimizer, warmup: int, total: int | None, schedule: str) -> LambdaLR:
    lr_factor(warmup, warmup, total, schedule)  # fail now, not at the first step after warm-up
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total, schedule))
