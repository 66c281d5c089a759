"""What the trainer drives (the learner, the eval pool, the episode runner holding the rollout backend), as
`build_trainer` (train/build.py) builds it, and how it is closed."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from kforge.evaluator.contention import GpuActivity
from kforge.policy.runner import EpisodeRunner

if TYPE_CHECKING:
    from kforge.evaluator import EvalPool
    from kforge.learner.learner import Learner
    from kforge.rollout.base import RolloutBackend
    from kforge.train.learner_proc import LearnerProcess

log = logging.getLogger("kforge.train")


@dataclass
class Parts:
    """What the trainer drives; built by `build_trainer`."""

    learner: Learner | LearnerProcess  # Learner: CPU, in-process
    pool: EvalPool
    runner: EpisodeRunner  # holds the rollout backend: the one reference a restart replaces
    shares_model: bool  # the rollout backend samples from the learner's in-process model (CPU mode)
    restart_backend: Callable[[], RolloutBackend] | None = None  # a fresh rollout backend (GPU placements)
    activity: GpuActivity = field(default_factory=GpuActivity)  # who used which GPU when (the pool reads it)

    @property
    def backend(self) -> RolloutBackend | None:
        return self.runner.backend if self.runner is not None else None

    def close(self) -> None:
        for part in (self.backend, self.pool, self.learner):
            close = getattr(part, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # closing must not hide the run's own outcome
                    log.warning("closing %s: %s", type(part).__name__, exc)
