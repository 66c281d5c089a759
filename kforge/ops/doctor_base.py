"""`kforge doctor`'s result row and what a config needs from the machine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from kforge.config.schema import KforgeConfig
from kforge.kernel_backends import KERNEL_BACKENDS

Status = Literal["pass", "warn", "fail"]
GIB = 1024**3


@dataclass
class CheckResult:
    check: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def can_start(results: list[CheckResult]) -> bool:
    return not any(r.status == "fail" for r in results)


# ---------------------------------------------------------------------------------------------- needs


def gpu_only(cfg: KforgeConfig) -> list[str]:
    """The settings of this config that cannot run at all without an NVIDIA GPU."""
    reasons = []
    if cfg.rollout.backend == "vllm":
        reasons.append("rollout.backend=vllm")
    if cfg.model.load_in_4bit:
        reasons.append("model.load_in_4bit=true")
    if KERNEL_BACKENDS[cfg.dataset.backend].needs_gpu:
        reasons.append(f"dataset.backend={cfg.dataset.backend}")
    return reasons


def gpu_reasons(cfg: KforgeConfig) -> list[str]:
    """The settings of this config that only work on an NVIDIA GPU: those of `gpu_only`, and kernel timing,
    without which a run is possible (`placement.allow_cpu`) but measures no speed."""
    reasons = gpu_only(cfg)
    if cfg.evaluator.measure_performance:
        reasons.append("evaluator.measure_performance=true (kernel timing)")
    return reasons
