"""The learner in its own process on its own GPUs, served through `kforge.served`.

The trainer's process never initialises CUDA for the learner: the spawned child starts with the learner's
CUDA_VISIBLE_DEVICES (its logical GPU indices mapped through `kforge.gpus`, as for the rollout worker and
the eval pool), builds the Learner there and answers calls. Every call has a deadline
(`learner.call_timeout_s`): a learner that dies or hangs is reported within it, and the run saves what
it can and fails with the reason (`--resume` continues from the last checkpoint). On a CPU-only machine
the learner stays in-process so the hf rollout backend can share its weights.
"""

from __future__ import annotations

from typing import Any

from kforge.gpus import child_visible_devices
from kforge.rollout.base import SamplingParams
from kforge.served import ServedError, ServedProcess

DEFAULT_FACTORY = "kforge.train.learner_proc:LearnerService"


class LearnerDied(RuntimeError):
    """The learner process died, hung past its deadline or failed; one line for the user first."""


class LearnerService:
    """What the child serves: the Learner, with the policy version returned where it changes."""

    def __init__(self, cfg_json: dict[str, Any], total_steps: int | None, sampling: SamplingParams | None = None,
                 device: str = "cuda") -> None:
        from kforge.config.schema import KforgeConfig
        from kforge.learner.learner import Learner

        cfg = KforgeConfig.model_validate(cfg_json)
        # Log-probs under the rollout's sampling settings, as the engine reports them (IS ratios).
        self.learner = Learner(cfg, device=device, total_steps=total_steps, sampling=sampling)

    def version(self) -> int:
        return int(self.learner.version)

    def train_step(self, samples: list[Any]) -> tuple[dict[str, float], int]:
        # Out-of-memory handling (smaller micro-batches) lives inside Learner.train_step.
        return self.learner.train_step(samples), int(self.learner.version)

    def save_adapter(self, path: str) -> None:
        self.learner.save_adapter(path)

    def save_checkpoint(self, path: str) -> None:
        self.learner.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.learner.load_checkpoint(path)
        return int(self.learner.version)


class LearnerProcess:
    """The Learner's interface (train_step, save_adapter, save/load_checkpoint, version) over a process."""

    def __init__(self, cfg: Any, devices: list[int], total_steps: int | None = None,
                 sampling: SamplingParams | None = None, *, factory: str = DEFAULT_FACTORY,
                 factory_kwargs: dict[str, Any] | None = None, log_path: str | None = None,
                 start_timeout_s: float = 1800.0) -> None:
        """`devices`: logical GPU indices as this process sees them; none = the CPU (tests)."""
        self.timeout_s = float(cfg.learner.call_timeout_s)
        kwargs = {"cfg_json": cfg.model_dump(mode="json"), "total_steps": total_steps, "sampling": sampling,
                  "device": "cuda" if devices else "cpu", **(factory_kwargs or {})}
        env = {"CUDA_VISIBLE_DEVICES": child_visible_devices(devices)}
        try:
            self._proc = ServedProcess(factory, kwargs, name="learner", env=env,
                                       log_path=log_path, start_timeout_s=start_timeout_s)
        except ServedError as exc:
            raise LearnerDied(f"the learner process failed to start: {exc}") from None
        # Cached so that the next step's rollouts can read it while a train_step is in flight (pipelined).
        self._version = int(self._call("version"))

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return self._proc.call(method, timeout_s=self.timeout_s, **kwargs)
        except ServedError as exc:
            raise LearnerDied(str(exc)) from None

    def train_step(self, samples: list[Any]) -> dict[str, float]:
        metrics, self._version = self._call("train_step", samples=samples)
        return metrics

    def save_adapter(self, path: str) -> None:
        self._call("save_adapter", path=str(path))

    def save_checkpoint(self, path: str) -> None:
        self._call("save_checkpoint", path=str(path))

    def load_checkpoint(self, path: str) -> None:
        self._version = int(self._call("load_checkpoint", path=str(path)))

    @property
    def version(self) -> int:
        return self._version

    def alive(self) -> bool:
        return self._proc.alive()

    def close(self) -> None:
        self._proc.close(timeout_s=30)
