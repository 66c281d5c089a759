"""Running sums of one train_step's metrics, and what a finished micro-batch contributes to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class Sums:
    """Token-weighted running sums for the step's metrics."""

    tokens: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, per_token: Tensor, mask: Tensor) -> None:
        picked = per_token.detach().float()[mask]
        self.values[name] = self.values.get(name, 0.0) + float(picked.sum().item())
        if picked.numel():
            self.maxima[name] = max(self.maxima.get(name, float("-inf")), float(picked.max().item()))

    def count(self, name: str, value: float) -> None:
        self.values[name] = self.values.get(name, 0.0) + value

    def mean(self, name: str) -> float:
        return self.values.get(name, 0.0) / self.tokens if self.tokens else 0.0


@dataclass
class Done:
    """What one micro-batch contributed, recorded only after its backward pass completed."""

    loss: float
    grads: list[Tensor | None]
    record: Any  # callable that adds the micro-batch's metrics to the step's sums
