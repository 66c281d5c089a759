"""One eval GPU's gate: the pool's GPU work shares it, timing holds it alone.

A kernel timed while another worker of the pool ran its correctness trials on the same GPU (GB-sized
inputs, heavy kernels) came out slower than it is, and so did its speedup. Every stage that has a child
do GPU work holds the gate shared (a child's start-up, its trials, the reference's runs, a draw of
inputs); timing holds it exclusively, so nothing else of the pool runs on that GPU meanwhile, and shared
holders overlap each other as before. A timer that waits keeps new shared holders out (writer
preference): else workers whose trials overlap could keep it out for good. Shared holders cannot starve
in turn: each worker times at most once per evaluation and its next evaluation's work is shared, so a run
of timers ends.

Two rules keep it free of deadlock, and the pool keeps both: a thread never asks for the gate while it
holds it (asking raises: a shared holder asking again behind a waiting timer would wait on itself), and
never waits on another thread's work while it holds it (an examination waits for its draw of inputs, whose
reference run needs a shared hold, holding nothing itself).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

SHARED, EXCLUSIVE = "shared", "exclusive"


class DeviceGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0  # shared holders now
        self._exclusive = False  # a timer holds it
        self._waiting = {SHARED: 0, EXCLUSIVE: 0}
        self._mine = threading.local()  # this thread's hold, if any

    def holding(self) -> str | None:
        """This thread's hold: SHARED, EXCLUSIVE or None."""
        return getattr(self._mine, "hold", None)

    def waiting(self) -> dict[str, int]:
        """How many threads wait for each kind of hold (what a test or a log may ask)."""
        with self._cond:
            return dict(self._waiting)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        return self._hold(SHARED)

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        return self._hold(EXCLUSIVE)

    def _free_for(self, kind: str) -> bool:
        if kind == SHARED:
            return not self._exclusive and not self._waiting[EXCLUSIVE]
        return not self._exclusive and not self._shared

    @contextlib.contextmanager
    def _hold(self, kind: str) -> Iterator[None]:
        if self.holding() is not None:
            raise RuntimeError(f"a {kind} hold asked for while this thread holds the gate {self.holding()}")
        with self._cond:
            self._waiting[kind] += 1
            try:
                self._cond.wait_for(lambda: self._free_for(kind))
            finally:
                self._waiting[kind] -= 1
                self._cond.notify_all()  # a timer that stopped waiting lets shared holders in
            if kind == SHARED:
                self._shared += 1
            else:
                self._exclusive = True
        self._mine.hold = kind
        try:
            yield
        finally:
            self._mine.hold = None
            with self._cond:
                if kind == SHARED:
                    self._shared -= 1
                else:
                    self._exclusive = False
                self._cond.notify_all()
