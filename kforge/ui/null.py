"""The dashboard that shows nothing: the trainer's view until `kforge train` gives it a real one (a test, an
eval, a trainer built without a terminal), so the trainer reports to one object and never asks whether it
has a view. Its methods are the Dashboard's, one for one (tests/house/test_run_lifecycle.py checks it)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


class NullDashboard:
    def __enter__(self) -> "NullDashboard":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def set_stage(self, stage: str, total: int = 0, step: int | None = None) -> None:
        pass

    def end_stage(self, stage: str) -> None:
        pass

    @contextlib.contextmanager
    def stage(self, stage: str, total: int = 0, step: int | None = None) -> Iterator[None]:
        yield

    def advance(self, n: int = 1, stage: str | None = None) -> None:
        pass

    def kernel(self, problem_key: str, turn: int, status: str, detail: str = "") -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def end_step(self, step: int, metrics: dict[str, Any], step_seconds: float) -> None:
        pass
