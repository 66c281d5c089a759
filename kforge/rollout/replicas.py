"""Data-parallel rollout: one engine per rollout GPU (or per tensor-parallel group), behind one backend.

A model that fits one GPU is served by one engine per GPU, not by one engine split over them all (tensor
parallel pays an all-reduce per layer and scales far below the GPU count). The router sends every request of
a route (a problem: its group of trajectories, all turns) to one replica, so the replica's prefix cache holds
the problem's prompt for the whole group; a new route goes to the live replica with the fewest routes. Adapter
syncs, sleep and wake go to every live replica; each completion keeps the adapter version its replica sampled
with.

A replica whose worker dies is restarted on its own, on its own GPUs, in a thread (a vLLM start takes
minutes) while the others keep serving: the dead engine is closed, a fresh one started (`start(k)`), and it
takes requests only once it holds the current adapter (and sleeps if the others do). Its requests are
retried on a live replica, and their routes move there. A replica that fails a second time (or whose
restart fails) is taken out with a warning and the run goes on with the rest; with none left a request
raises `NoReplicaLeft`, which the trainer does not answer with a restart of the whole backend. While the
replicas sleep (colocated: the learner ranks train on their GPUs) a restart waits for `wake` before it
starts vLLM, which sizes itself from the GPU's free memory, the learner's during its step.

An error of a replica that is still alive (an engine error for one request, a bad adapter folder) is not a
replica failure: nothing is restarted. A request that fails so is tried once more on its replica (a passing
fault); failing again it raises `RequestFailed`, which is final like `NoReplicaLeft`: the trainer used to
restart every engine for it, minutes per engine for one request that a live engine refuses. (A vLLM engine
that died behind its live worker process counts as dead, `VLLMBackend.alive`, and is restarted.)
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import logging
import threading
from typing import Callable

from kforge.rollout.base import (
    BackendDefaults,
    BackendError,
    Completion,
    GenerationRequest,
    OnCompletion,
    RolloutBackend,
)

log = logging.getLogger("kforge.rollout")

LIVE, RESTARTING, OUT = "live", "restarting", "out"


class NoReplicaLeft(BackendError):
    """Every rollout replica failed twice; restarting the whole backend would only repeat that."""

    final = True  # the trainer ends the run instead of restarting the backend


class RequestFailed(BackendError):
    """A request failed twice on a replica that is up: the request's own error, not an engine's death."""

    final = True  # the trainer ends the run instead of restarting every engine


class Replicas(BackendDefaults):
    concurrent = True

    def __init__(self, replicas: list[RolloutBackend], start: Callable[[int], RolloutBackend] | None = None,
                 max_failures: int = 2) -> None:
        """`start(k)`: a fresh engine on replica k's GPUs (None: a failed replica is taken out at once)."""
        if not replicas:
            raise ValueError("data-parallel rollout needs at least one engine")
        self.replicas = list(replicas)
        self.tokenizer = replicas[0].tokenizer
        self.adapter_dtype = replicas[0].adapter_dtype  # the adapter copies' (EngineCopies)
        self.state = [LIVE] * len(replicas)
        self.failures = [0] * len(replicas)
        self.restarts = 0  # replicas started again after a failure (the trainer's `rollout/worker_restarts`)
        self._start = start
        self._max_failures = max_failures
        self._adapter: tuple[str, int] | None = None  # the latest sync: what a restarted replica loads
        self._asleep = False
        self._closed = False
        self._routes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a replica's state changed
        self._fan = cf.ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix="kforge-replica")

    @property
    def version(self) -> int:
        with self._lock:
            return min((int(self.replicas[k].version or 0) for k in self._live()), default=0)

    def _live(self) -> list[int]:
        return [k for k, s in enumerate(self.state) if s == LIVE]

    def replica_of(self, route: str) -> int | None:
        """The live replica a route is pinned to; a new route (or one whose replica is down) takes the live
        replica holding the fewest routes. None: no replica is live now."""
        with self._lock:
            return self._route(route)

    def _route(self, route: str) -> int | None:
        k = self._routes.get(route)
        if k is not None and self.state[k] == LIVE:
            return k
        live = self._live()
        if not live:
            return None
        load = collections.Counter(self._routes.values())
        self._routes[route] = k = min(live, key=lambda i: (load[i], i))
        return k

    async def _pick(self, route: str) -> tuple[int, RolloutBackend]:
        """A live replica for the route, waiting for one that is restarting when none is live."""
        while True:
            with self._lock:
                if self._closed:
                    raise BackendError("rollout replicas are closed (generate)")
                k = self._route(route)
                if k is None and RESTARTING not in self.state:
                    raise NoReplicaLeft(f"every rollout replica failed {self._max_failures} times; none is left")
                engine = self.replicas[k] if k is not None else None
            if engine is None:
                await asyncio.sleep(0.05)
            elif engine.alive() is False:  # died since its last call: restart it and take another
                self._failed(k, engine, None)
            else:
                return k, engine

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return asyncio.run(self.agenerate(requests)) if requests else []

    async def agenerate(self, requests: list[GenerationRequest],
                        on_completion: OnCompletion | None = None) -> list[Completion]:
        async def one(i: int, r: GenerationRequest) -> Completion:
            c = await self._one(r)
            if on_completion is not None:
                on_completion(i, c)
            return c

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))

    async def _one(self, r: GenerationRequest) -> Completion:
        """One request on its route's replica. A replica found down is restarted (or taken out) and the
        request goes to a live one; every such retry ends a replica's engine, so they are bounded by the
        replicas' failures (then `NoReplicaLeft`). An error of a replica that is up is tried once more there,
        then raised as `RequestFailed`: nothing is restarted for it."""
        refused: BackendError | None = None
        while True:
            k, engine = await self._pick(r.route)  # after a failure the route moves to a live replica
            try:
                return (await engine.agenerate([r]))[0]
            except BackendError as exc:
                if self._failed(k, engine, exc):
                    continue
                if refused is not None:
                    raise RequestFailed(f"rollout replica {k} refused a request twice: {exc}") from exc
                refused = exc

    # ------------------------------------------------------------------ failures and restarts
    def _failed(self, k: int, engine: RolloutBackend, exc: BaseException | None) -> bool:
        """Replica k (`engine`) raised `exc`. True when it is down (then it is restarting or out), False when
        it is alive (the error was the request's or the call's own)."""
        if exc is not None and engine.alive():
            return False
        why = str(exc).splitlines()[0] if exc is not None and str(exc) else "its worker is not alive"
        with self._lock:
            if self.replicas[k] is not engine or self.state[k] != LIVE:
                return True  # already seen by another of its requests
            self.failures[k] += 1
            restart = self._start is not None and not self._closed and self.failures[k] < self._max_failures
            self.state[k] = RESTARTING if restart else OUT
            self._changed.notify_all()
        if restart:
            log.warning("rollout replica %d failed (%s); restarting it while the others serve", k, why)
            threading.Thread(target=self._bring_up, args=(k, engine), name=f"kforge-replica{k}-restart",
                             daemon=True).start()
        else:
            self._take_out(k, engine, why)
        return True

    def _take_out(self, k: int, engine: RolloutBackend | None, why: str) -> None:
        with self._lock:
            self.state[k] = OUT
            left = len(self._live()) + self.state.count(RESTARTING)
            closed = self._closed
            self._changed.notify_all()
        if not closed:
            log.warning("rollout replica %d failed (%s) and is taken out; %d replica(s) left%s", k, why, left,
                        "" if left else ": the run cannot go on")
        if engine is not None:
            threading.Thread(target=_close_quietly, args=(engine,), daemon=True).start()

    def _bring_up(self, k: int, dead: RolloutBackend) -> None:
        """Replica k again: the dead engine closed (its GPU memory freed), a fresh one started, given the
        latest adapter (and put to sleep when the others sleep), then live."""
        _close_quietly(dead)
        engine, have, asleep = None, None, False
        with self._changed:  # asleep: the learner trains on these GPUs (colocated); start once they wake
            self._changed.wait_for(lambda: not self._asleep or self._closed)
        try:
            engine = self._start(k) if not self._closed else None  # type: ignore[misc]
            while True:
                with self._lock:
                    if self._closed:
                        self.state[k] = OUT
                        self._changed.notify_all()
                        break
                    want, sleep = self._adapter, self._asleep
                    if want == have and sleep == asleep:  # checked under the lock a sync or a sleep takes
                        self.replicas[k], self.state[k] = engine, LIVE
                        self.restarts += 1
                        self._changed.notify_all()
                        log.info("rollout replica %d is serving again (adapter version %s)", k,
                                 want[1] if want else "none")
                        return
                if want is not None and want != have:
                    try:
                        engine.load_adapter(*want)
                    except BackendError:
                        with self._lock:
                            if self._adapter == want or engine.alive() is False:
                                raise
                        continue  # a newer sync came meanwhile (this folder may be pruned): load that one
                    have = want
                if sleep != asleep:
                    (engine.sleep if sleep else engine.wake)()
                    asleep = sleep
        except Exception as exc:  # its second failure
            with self._lock:
                self.failures[k] += 1
            self._take_out(k, engine, f"its restart failed: {str(exc).splitlines()[0] if str(exc) else exc!r}")
            return
        if engine is not None:
            _close_quietly(engine)  # closed while it started

    def wait_restarts(self, timeout_s: float | None = None) -> bool:
        """Wait until no replica is restarting; False when `timeout_s` passed first. The trainer calls it
        before a colocated learner step, while the replicas are awake (asleep, a restart waits for `wake`)."""
        with self._changed:
            return self._changed.wait_for(lambda: RESTARTING not in self.state, timeout_s)

    # ------------------------------------------------------------------ every replica
    def _every(self, targets: list[tuple[int, RolloutBackend]], method: str, *args: str | int) -> None:
        """The call on every live replica at once (an adapter load takes seconds per engine). A replica
        that is down meanwhile is restarted or taken out; the first error of a live one raises."""
        futures = [(k, e, self._fan.submit(getattr(e, method), *args)) for k, e in targets]
        error = None
        for k, engine, fut in futures:
            try:
                fut.result()
            except BackendError as exc:
                if not self._failed(k, engine, exc) and error is None:
                    error = exc
        if error is not None:
            raise error

    def _set(self, **state: tuple[str, int] | bool) -> list[tuple[int, RolloutBackend]]:
        """Record what a restarted replica must match and name the live replicas, in one step."""
        with self._lock:
            for name, value in state.items():
                setattr(self, name, value)
            self._changed.notify_all()  # a restart waiting for the replicas to wake
            return [(k, self.replicas[k]) for k in self._live()]

    def load_adapter(self, path: str, version: int) -> None:
        self._every(self._set(_adapter=(path, version)), "load_adapter", path, version)

    def sleep(self) -> None:
        self._every(self._set(_asleep=True), "sleep")

    def wake(self) -> None:
        self._every(self._set(_asleep=False), "wake")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            engines = [e for e, s in zip(self.replicas, self.state) if s != OUT]
            self._changed.notify_all()
        for engine in engines:
            _close_quietly(engine)
        self._fan.shutdown(wait=False)


def _close_quietly(engine: RolloutBackend) -> None:
    try:
        engine.close()
    except Exception as exc:  # a dead worker: closing is best effort
        log.warning("closing a failed rollout replica: %s", exc)
