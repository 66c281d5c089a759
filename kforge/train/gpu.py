"""GPU memory and utilisation per role for the step metrics, read through `kforge.gpus` (nvidia-smi or
NVML), never by initialising CUDA in the trainer's process."""

from __future__ import annotations

import threading
from typing import Callable

from kforge.gpus import matches, query_gpus
from kforge.train.placement import ROLES, Plan


def role_gpu_stats(plan: Plan) -> dict[str, float]:
    if plan.mode == "cpu":
        return {}
    gpus, _ = query_gpus()
    out: dict[str, float] = {}
    for role in ROLES:
        rows = [g for i in getattr(plan, role) for g in gpus or [] if matches(plan.gpus[i], g)]
        if rows:
            out[f"gpu/{role}/mem_used_gb"] = sum(g.used_mib for g in rows) / 1024
            utils = [g.util_pct for g in rows if g.util_pct is not None]
            if utils:
                out[f"gpu/{role}/util_pct"] = sum(utils) / len(utils)
    return out


class PeakMemory:
    """The peak memory of each role's GPUs over a step, sampled through `kforge.gpus` (a reading after the
    step misses the learner's backward pass and the eval children, which are gone by then). `take()`
    returns the peaks since the previous call and starts over."""

    def __init__(self, plan: Plan, every_s: float = 0.5, query: Callable[[], tuple[list | None, str]] = query_gpus):
        self.plan, self.every_s, self.query = plan, every_s, query
        self._peaks: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PeakMemory":
        if self.plan.mode != "cpu":
            self._thread = threading.Thread(target=self._loop, name="kforge-gpu-peak", daemon=True)
            self._thread.start()
        return self

    def sample(self) -> None:
        gpus, _ = self.query()
        for role in ROLES:
            rows = [g for i in getattr(self.plan, role) for g in gpus or [] if matches(self.plan.gpus[i], g)]
            if rows:
                used = sum(g.used_mib for g in rows) / 1024
                with self._lock:
                    self._peaks[role] = max(used, self._peaks.get(role, 0.0))

    def take(self) -> dict[str, float]:
        with self._lock:
            peaks, self._peaks = self._peaks, {}
        return {f"gpu/{role}/peak_mem_gb": value for role, value in peaks.items()}

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()
