"""Running sums of one train_step's metrics, and what a finished micro-batch contributes to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch import Tensor

# Every key of train_step's metrics, in log order.
METRIC_KEYS = (
    "loss", "kl", "entropy", "clip_fraction", "is_ratio_mean", "is_ratio_max", "is_clip_fraction",
    "rollout_logprob_diff", "grad_norm", "grad_norm_max", "tokens", "response_tokens", "tokens_per_s",
    "samples", "step_s", "lr", "optimizer_steps", "version", "skipped", "nonfinite_steps", "oom_retries",
    "mismatch_rejected",
)


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
    record: Callable[[Sums, dict[str, float]], None]  # adds the micro-batch's metrics to the step's sums and stats


def step_metrics(sums: Sums, stats: dict[str, float], applied: int, samples: int, elapsed: float, lr: float,
                 optimizer_steps: int, version: int) -> dict[str, float]:
    """train_step's metrics (``METRIC_KEYS``) from the step's sums; ``applied`` is
    the number of optimiser steps that were finite and taken."""
    has_is = sums.values.get("_is_tokens", 0.0)
    return {
        "loss": stats["loss"] / applied if applied else 0.0,
        "kl": sums.mean("kl"),
        "entropy": sums.mean("entropy"),
        "clip_fraction": sums.mean("clipped"),
        "is_ratio_mean": sums.values.get("is_ratio", 0.0) / has_is if has_is else 1.0,
        "is_ratio_max": sums.maxima.get("is_ratio", 1.0) if has_is else 1.0,
        "is_clip_fraction": sums.values.get("is_clipped", 0.0) / has_is if has_is else 0.0,
        "rollout_logprob_diff": sums.values.get("logp_diff", 0.0) / has_is if has_is else 0.0,
        "grad_norm": stats["grad_norm"] / applied if applied else 0.0,
        "grad_norm_max": stats["grad_norm_max"],
        "tokens": stats["tokens"],
        "response_tokens": sums.tokens,
        "tokens_per_s": stats["tokens"] / elapsed if elapsed > 0 else 0.0,
        "samples": float(samples),
        "step_s": elapsed,
        "lr": lr,
        "optimizer_steps": float(optimizer_steps),
        "version": float(version),
        "skipped": 0.0,
        "nonfinite_steps": sums.values.get("nonfinite_steps", 0.0),
        "oom_retries": sums.values.get("oom_retries", 0.0),
        "mismatch_rejected": sums.values.get("mismatch_rejected", 0.0),
    }
