"""The learner in its own process on its own GPUs.

The trainer's process never initialises CUDA for the learner: a spawned child sets CUDA_VISIBLE_DEVICES
before it imports torch, builds the Learner there and serves calls over a Pipe. On a CPU-only machine the
learner stays in-process (`InProcessLearner`) so the hf rollout backend can share its weights.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import traceback
from typing import Any


class LearnerDied(RuntimeError):
    pass


def _serve(conn: Any, cfg_json: dict[str, Any], visible: str, total_steps: int | None) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        from kforge.config.schema import KforgeConfig
        from kforge.learner.learner import Learner

        cfg = KforgeConfig.model_validate(cfg_json)
        # Log-probs under the sampling temperature, as the rollout engine reports them (IS ratios).
        learner = Learner(cfg, device="cuda", total_steps=total_steps, temperature=cfg.rollout.temperature)
        conn.send(("ready", None))
    except BaseException:  # report any start-up failure to the parent, then exit
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "close":
            conn.send(("ok", None))
            return
        try:
            if method == "version":
                result = learner.version
            elif method == "oom_retry_train_step":
                result = _train_with_oom_retry(learner, *args)
            else:
                result = getattr(learner, method)(*args)
            conn.send(("ok", result))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


def _train_with_oom_retry(learner: Any, samples: list[Any]) -> dict[str, float]:
    """Out of memory: halve the micro-batch token budget and retry once; a second OOM is an error."""
    import torch

    try:
        return learner.train_step(samples)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        learner.cfg.learner.micro_batch_tokens = max(256, learner.cfg.learner.micro_batch_tokens // 2)
        metrics = learner.train_step(samples)
        metrics["learner/oom_retries"] = 1.0
        return metrics


class LearnerProcess:
    def __init__(self, cfg: Any, visible_devices: str, total_steps: int | None = None, start_timeout: float = 1800):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, cfg.model_dump(mode="json"), visible_devices, total_steps), daemon=True,
            name="kforge-learner",
        )
        self._proc.start()
        child.close()
        if not self._conn.poll(start_timeout):
            self.close()
            raise LearnerDied("learner process did not start in time")
        kind, payload = self._conn.recv()
        if kind != "ready":
            self.close()
            raise LearnerDied(f"learner process failed to start:\n{payload}")
        # One call at a time on the pipe; the version is cached so that the next step's rollouts can read
        # it while a train_step is in flight (pipelined mode).
        self._lock = threading.Lock()
        self._version = int(self._call("version"))

    def _call(self, method: str, *args: Any) -> Any:
        try:
            with self._lock:
                self._conn.send((method, args))
                kind, payload = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            raise LearnerDied(f"learner process exited (code {self._proc.exitcode})") from None
        if kind == "error":
            raise RuntimeError(f"learner.{method} failed in the learner process:\n{payload}")
        return payload

    def train_step(self, samples: list[Any]) -> dict[str, float]:
        metrics = self._call("oom_retry_train_step", samples)
        self._version = int(self._call("version"))
        return metrics

    def save_adapter(self, path: str) -> None:
        self._call("save_adapter", str(path))

    def save_checkpoint(self, path: str) -> None:
        self._call("save_checkpoint", str(path))

    def load_checkpoint(self, path: str) -> None:
        self._call("load_checkpoint", str(path))
        self._version = int(self._call("version"))

    @property
    def version(self) -> int:
        return self._version

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close", ()))
                self._conn.poll(30)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
