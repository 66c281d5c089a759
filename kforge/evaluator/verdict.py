"""The Verdict record: what the evaluator says about one candidate kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    FORMAT_ERROR = "format_error"  # no parsable kernel block in the response
    STATIC_CHECK_FAILED = "static_check_failed"  # source rejected before running (no ModelNew, pure PyTorch...)
    COMPILE_ERROR = "compile_error"
    RUNTIME_ERROR = "runtime_error"
    TIMEOUT = "timeout"
    CRASHED = "crashed"  # the child died (signal, OOM kill, sticky CUDA error)
    INCORRECT = "incorrect"
    CORRECT = "correct"
    UNSUPPORTED = "unsupported"  # e.g. a CUDA candidate on a machine without a GPU

    @property
    def compiled(self) -> bool:
        """Did the candidate's code compile, as far as the parent saw: one of its calls ran to its answer
        (examine.py names everything that ended it earlier a compile error)."""
        return self in (Status.RUNTIME_ERROR, Status.TIMEOUT, Status.CRASHED, Status.INCORRECT, Status.CORRECT)


@dataclass
class Timings:
    """Milliseconds per forward call (CUDA events), over `trials` timed trials."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    trials: int


@dataclass
class Verdict:
    status: Status
    trials_passed: int = 0
    trials: int = 0
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    timings: Timings | None = None
    baseline: Timings | None = None
    speedup: float | None = None  # baseline mean / kernel_ms; None when not timed
    # The per-call time the speedup is computed from: the mean reported time, raised to what the
    # parent's own clock allows when the two disagree (timing_check.check_timing).
    kernel_ms: float | None = None
    flags: list[str] = field(default_factory=list)  # reward-hacking findings; any flag voids the reward
    compile_s: float = 0.0
    run_s: float = 0.0
    feedback: str = ""  # short text for the model's next turn
    error: str = ""  # cleaned error lines (no sandbox paths, no secrets)
    timing_meaningful: bool = True  # False under the Triton interpreter
    # Share of the candidate's GPU time spent in its own kernels (torch.profiler, GPU only; None when
    # not measured). Evidence from the candidate's process: it scales speed reward, never grants it.
    coverage: float | None = None
    details: dict[str, Any] = field(default_factory=dict)  # per-stage durations and the like

    @property
    def correct(self) -> bool:
        return self.status is Status.CORRECT and not self.flags

    @property
    def partial_credit(self) -> float:
        return self.trials_passed / self.trials if self.trials else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["status"] = self.status.value
        out["correct"] = self.correct
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["status"] = Status(data["status"])
        for key in ("timings", "baseline"):
            if isinstance(data.get(key), dict):
                data[key] = Timings(**data[key])
        return cls(**data)
