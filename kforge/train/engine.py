"""The rollout engine as the trainer drives it outside a generate call: adapter hand-overs, sleep and wake
around a colocated learner step, and the restart of an engine that died. One of these at a time (a lock),
and the trainer runs each off its event loop (a vLLM start takes minutes).

A restart starts a fresh backend (`Parts.restart_backend`) and hands it the adapter the engine was last
given, from the folder that hand-over used: the weights and the version label that went together then. It
asks the learner for nothing, so it never waits behind a train step. (Pipelined, the next step's rollouts
find the engine dead while the learner trains; a restart that asked the learner for its adapter then got,
once the step ended, the new weights written over the previous version's folder under the previous version
number, and that call's deadline counted the rest of the step.) The hand-over after the step takes the lock,
so it waits for the restart and gives the fresh engine the new adapter. A fresh engine is a new process:
its LoRA ids start over with an empty prefix cache, so loading a version again there meets no stale block.

An engine found dead outside a rollout is restarted too, instead of failing the run: in a hand-over (the
fresh one then gets that adapter) or at wake. One found dead by the sleep before a colocated learner step is
started again only at wake, after the step: vLLM sizes itself from its GPU's free memory, which is the
learner rank's while it trains. For the same reason data-parallel replicas still restarting are waited for
before that step (`Replicas.wait_restarts`), and a replica found dead while they sleep starts at wake.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from kforge.rollout.base import BackendError, RolloutBackend

if TYPE_CHECKING:
    from kforge.train.parts import Parts

log = logging.getLogger("kforge.train")


class RolloutEngine:
    """The trainer's hold on its rollout backend between generate calls (hand-overs, sleep, wake, restarts)."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts  # the trainer's Parts: `parts.runner.backend` is the one reference a restart replaces
        self.restarts = 0  # whole-backend restarts (data-parallel replicas count their own)
        self.given: tuple[str, int] | None = None  # the last adapter handed over: what a fresh engine loads
        self.lock = threading.RLock()  # a hand-over, a sleep or wake and a restart: one at a time
        self._down: BackendError | None = None  # the engine died when put to sleep: restarted at wake

    def hand_over(self, write: Callable[[], str], version: int) -> float:
        """The adapter folder `write()` returns, to the engine as `version`; a dead engine is restarted with
        it. Returns the seconds `write` took."""
        with self.lock:  # the write too: a restart meanwhile must not load a folder this write replaces
            t0 = time.time()
            path = write()
            wrote = time.time() - t0
            self.given = (path, version)
            self._or_restart("load_adapter", path, version)
            return wrote

    def before_learning(self, sleep: bool) -> None:
        """Colocated, before the learner's step: no replica may be starting on its GPUs meanwhile, and the
        engines sleep when `sleep`. One found dead stays down until `after_learning`."""
        with self.lock:
            self.parts.backend.wait_restarts()
            if not sleep:
                return
            try:
                self.parts.backend.sleep()
            except BackendError as exc:
                if not _dead(self.parts.backend):
                    raise
                log.warning("the rollout engine died as it was put to sleep (%s); it starts again after the "
                            "learner's step", _first_line(exc))
                self._down = exc

    def after_learning(self, wake: bool) -> None:
        with self.lock:
            down, self._down = self._down, None
            if down is not None:
                self._restart(down)
            elif wake:
                self._or_restart("wake")

    def restart(self, exc: BaseException) -> None:
        with self.lock:
            self._restart(exc)

    def settle(self) -> None:
        """Wait for a restart under way (one of rollouts that were cancelled goes on in its thread)."""
        with self.lock:
            pass

    def _or_restart(self, method: str, *args: str | int) -> None:
        try:
            getattr(self.parts.backend, method)(*args)
        except BackendError as exc:
            if not _dead(self.parts.backend):
                raise  # an engine that is up refused it (a bad adapter folder): a fresh one would too
            self._restart(exc)

    def _restart(self, exc: BaseException) -> None:
        parts = self.parts
        if parts.shares_model or parts.restart_backend is None or getattr(exc, "final", False):
            raise exc  # final: every data-parallel replica failed twice (each restarts on its own first)
        log.warning("rollout worker failed (%s); restarting it", _first_line(exc))
        try:
            parts.backend.close()
        except Exception as close_exc:  # the worker is already gone; closing is best effort
            log.warning("closing the failed rollout worker: %s", close_exc)
        parts.runner.backend = parts.restart_backend()
        self.restarts += 1
        if self.given is not None:  # what the dead engine had (None: it had nothing yet)
            parts.backend.load_adapter(*self.given)


def _dead(backend: RolloutBackend) -> bool:
    """The engine says its worker is gone (a backend that cannot tell, or a router of replicas that restart on
    their own, answers alive: its error is raised)."""
    return backend.alive() is False


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]
