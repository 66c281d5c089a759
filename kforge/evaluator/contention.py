"""Which roles kept which devices busy, and when, so that a timed run can say whether it shared its GPU.

During training the learner steps and the engine decodes on GPUs the eval pool may also time kernels on
(one GPU for everything; two GPUs, pipelined). A kernel timed then is slower than it is, and its speedup
stays in the verdict cache. The trainer marks each learner step and each rollout phase on its devices; the
pool asks, after every timed run, which of them overlapped it on the run's device. The verdict says so
(`details["timing_contended"]`: the roles) and the step counts them (`timing/contended`). Devices are the
trainer's logical GPU indices; "cpu" stands for the CPU, which every role shares on a machine without GPUs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

Device = int | str


class GpuActivity:
    def __init__(self, clock: Callable[[], float] = time.monotonic, keep_s: float = 3600.0) -> None:
        self.clock, self.keep_s = clock, keep_s
        self._lock = threading.Lock()
        self._spans: list[list] = []  # [role, devices, start, end or None while running]

    @contextlib.contextmanager
    def busy(self, role: str, devices: list[int] | None) -> Iterator[None]:
        """`role` keeps `devices` busy for the `with` block (none: the CPU)."""
        span = [role, frozenset(devices) if devices else frozenset(["cpu"]), self.clock(), None]
        with self._lock:
            now = span[2]
            self._spans = [s for s in self._spans if s[3] is None or now - s[3] < self.keep_s]
            self._spans.append(span)
        try:
            yield
        finally:
            with self._lock:
                span[3] = self.clock()

    def overlapping(self, device: Device | None, start: float, end: float) -> list[str]:
        """The roles busy on `device` (None: the CPU) at any moment of [start, end]."""
        device = "cpu" if device is None else device
        with self._lock:
            return sorted({role for role, devices, s, e in self._spans
                           if device in devices and s <= end and (e is None or e >= start)})
