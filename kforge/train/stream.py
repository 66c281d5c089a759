"""Continuous rollouts (`rollout.mode=continuous`): GRPO groups flow to the learner one at a time, so a step
no longer waits for the longest chain of its own batch.

A group (one problem x `dataset.group_size` chains, each up to `episode.max_turns` turns) is the unit. It
starts as soon as admission allows (`may_start`): fewer than `rollout.max_groups_in_flight` groups in flight,
and a lag that stays within `rollout.max_staleness` for the learner step that will take it. It joins the pool
of completed groups once all its chains stopped. The learner's step takes the first B (`dataset.batch_size`)
completed groups, oldest start version first (`pick`); a completed group more than `max_staleness` versions
behind the learner at that moment is dropped and counted, and a group in flight that can no longer be taken
in time is cancelled and counted with them. Each turn keeps the adapter version that sampled it (the engine
says so with each completion), and the loss corrects every sample by its own rollout log-probs.

Where the engine and the learner share GPUs (colocated, or the CPU's one in-process model) nothing may
generate while the learner trains (the engines sleep, or the model is the one being trained): engine calls
then wait at a gate (`EngineGate`) for the step's length, while chains that wait for verdicts go on. On a
split placement generation goes on during the learner's step.

Problems are drawn one group at a time in the visiting order (`ProblemSampler.problem_at`: epoch after
epoch), each group sampled from its own seed (run seed, its index in that order). A checkpoint records the
next index and the groups drawn but not taken; a resume starts those again first, from scratch on the
restored adapter, then goes on: the same problems in the same order as an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol

from kforge.policy.runner import EpisodeRunner, Rollouts, RolloutStats
from kforge.problems.record import Problem
from kforge.rollout.base import BackendError
from kforge.rollout.queue import EngineGate
from kforge.train.data import ProblemSampler, step_seed
from kforge.train.metrics import stream_metrics

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig
    from kforge.policy.records import Trajectory, Turn
    from kforge.train.parts import Parts
    from kforge.train.placement import Plan


class StreamOwner(Protocol):
    """What `GroupStream.of` reads of its Trainer (train/trainer.py imports this module, so it is named by
    what it has)."""

    parts: Parts
    sampler: ProblemSampler
    cfg: KforgeConfig
    plan: Plan
    step: int

    def _restart_backend(self, exc: Exception, step: int) -> None: ...

    def _on_turn(self, trajectory: Trajectory, turn: Turn) -> None: ...

log = logging.getLogger("kforge.train")


def may_start(*, engine_version: int, learner_version: int, outstanding: int, in_flight: int, batch_size: int,
              max_staleness: int, max_in_flight: int) -> bool:
    """May one more group start now? `learner_version`: the version of the weights the learner's next take
    trains (one more than the learner's from a take until the end of its step); `outstanding`: groups started and not yet
    taken (in flight and completed). Taken in start order, the new one joins the step that takes it after
    the `outstanding` ones: `outstanding // batch_size` steps after the next, whose weights must be no more
    than `max_staleness` versions past the engine's."""
    if in_flight >= max_in_flight or engine_version < learner_version - max_staleness:
        return False
    return learner_version + outstanding // batch_size - engine_version <= max_staleness


@dataclass
class Group:
    seq: int  # its index in the visiting order (draw order)
    problem: Problem
    version: int  # the engine's adapter version when it started: its oldest turn's at the latest
    started: float = field(default_factory=time.time)
    ended: float = 0.0
    rollouts: Rollouts | None = None
    task: asyncio.Task | None = None


def pick(done: list[Group], learner_version: int, max_staleness: int, batch_size: int) -> tuple[list[Group], list[Group]]:
    """(taken, stale) for a learner at `learner_version`: the completed groups more than `max_staleness` versions
    behind it are stale; of the others, the first `batch_size` by start version, then draw order."""
    stale = [g for g in done if learner_version - g.version > max_staleness]
    fresh = sorted((g for g in done if learner_version - g.version <= max_staleness), key=lambda g: (g.version, g.seq))
    return fresh[:batch_size], stale


class GroupStream:
    """The groups of a continuous run: started by admission in the background, taken B at a time by `take`."""

    def __init__(self, runner: EpisodeRunner, sampler: ProblemSampler, cfg: KforgeConfig, learner_version: Callable[[], int],
                 restart: Callable[[BaseException], None], on_turn: Callable[..., None], overlap: bool) -> None:
        self.runner, self.sampler, self.cfg = runner, sampler, cfg
        self.learner_version, self.restart, self.on_turn, self.overlap = learner_version, restart, on_turn, overlap
        self.batch_size, self.max_staleness = cfg.dataset.batch_size, cfg.rollout.max_staleness
        self.max_in_flight = cfg.rollout.max_groups_in_flight or 2 * self.batch_size
        self.next_seq = 0  # the next index of the visiting order to draw
        self.redo: list[int] = []  # drawn before a resume and never taken: drawn again first
        self.in_flight: list[Group] = []
        self.done: list[Group] = []
        self.started: list[int] = []  # every index started, in order (redraws included)
        self.taken: list[list[int]] = []  # the indices each take returned
        self.gate = EngineGate()
        self.dropped_total = 0
        self._dropped_now = 0  # since the last take
        self._next_take_version = 0  # the learner's version at the next take, as far as the stream knows
        self.last_metrics: dict[str, float] = {}
        self._failure: BaseException | None = None
        self._changed: asyncio.Event | None = None
        self._admission: asyncio.Task | None = None
        self._restarting: asyncio.Lock | None = None
        runner.engine_gate = self.gate.passage

    @classmethod
    def of(cls, trainer: StreamOwner) -> "GroupStream":
        """The stream of a Trainer (train/trainer.py): its runner, problem order and learner; a dead engine
        restarted by its rule; generation overlaps the learner's step on a split placement only."""
        return cls(trainer.parts.runner, trainer.sampler, trainer.cfg, lambda: trainer.parts.learner.version,
                   lambda exc: trainer._restart_backend(exc, trainer.step + 1), trainer._on_turn,
                   overlap=trainer.plan.mode == "split")

    # -- the trainer's calls --------------------------------------------------------------------------
    async def take(self, stage: AbstractContextManager[None] | None = None) -> Rollouts:
        """The next learner batch: B completed groups, waiting for them as long as it takes (inside `stage`,
        the dashboard's)."""
        with stage if stage is not None else contextlib.nullcontext():
            return await self._take()

    async def _take(self) -> Rollouts:
        t0 = time.time()
        self._start()
        while True:
            if self._failure is not None:
                raise self._failure
            version = self.learner_version()
            taken, stale = pick(self.done, version, self.max_staleness, self.batch_size)
            self._drop(stale, self._older_than(version))  # in flight: stale once complete
            if len(taken) >= self.batch_size:
                break
            await self._wait()
        self._drop([], self._older_than(version + 1))  # in flight: too old for the next take too
        self.done = [g for g in self.done if g not in taken]
        self.taken.append([g.seq for g in taken])
        self._next_take_version = version + 1
        self._changed.set()  # room for more groups
        wait_s = time.time() - t0
        self.last_metrics = stream_metrics([version - g.version for g in taken], len(self.in_flight),
                                           self._dropped_now, self.dropped_total, wait_s)
        self._dropped_now = 0
        return Rollouts([t for g in taken for t in g.rollouts.trajectories], _merged([g for g in taken]))

    @contextlib.asynccontextmanager
    async def learning_step(self) -> AsyncIterator[None]:
        """Around the learner's step: without an overlap (shared GPUs) no engine call runs meanwhile (the gate
        waits for the ones under way); groups in flight that wait for verdicts go on."""
        try:
            if not self.overlap:
                await self.gate.close()
            yield
        finally:
            self.gate.open()
            if self._changed is not None:
                self._changed.set()

    async def close(self) -> None:
        """Cancel admission and every group in flight (at the run's end or failure); the groups not taken stay
        in the state a checkpoint records."""
        self.redo = sorted(self.redo + [g.seq for g in self.in_flight + self.done])
        tasks = [t for t in [self._admission] + [g.task for g in self.in_flight] if t is not None and not t.done()]
        self.in_flight, self.done, self._admission = [], [], None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.gate.open()

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs: the next index, and the indices drawn and not taken (started again first)."""
        pending = sorted(self.redo + [g.seq for g in self.in_flight + self.done])
        return {"next": self.next_seq, "redo": pending, "dropped_total": self.dropped_total}

    def load_state_dict(self, state: dict[str, Any] | None, sampler: dict[str, int]) -> None:
        """A continuous run's state; a run that went on in step mode so far goes on where its sampler is."""
        if state is None:
            state = {"next": sampler["epoch"] * len(self.sampler.problems) + sampler["cursor"], "redo": []}
        self.next_seq, self.redo = int(state["next"]), [int(s) for s in state["redo"]]
        self.dropped_total = int(state.get("dropped_total", 0))

    @property
    def epoch(self) -> int:
        newest = max((s for seqs in self.taken for s in seqs), default=self.next_seq)
        return newest // len(self.sampler.problems)

    # -- admission ------------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._admission is None:
            self._changed, self._restarting = asyncio.Event(), asyncio.Lock()
            self._admission = asyncio.ensure_future(self._admit())

    async def _admit(self) -> None:
        while True:
            while self._failure is None and self._may_start():
                self._launch(self.redo.pop(0) if self.redo else self._draw())
            # Versions change without a word to the stream (a step's end, an adapter sync): look again soon.
            await self._wait(0.2)

    def _draw(self) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    def _may_start(self) -> bool:
        # Once a take is made, the next one trains the version its step makes (from the take on, not from
        # the learner's step: the credit step comes between).
        learner = max(self.learner_version(), self._next_take_version)
        return may_start(engine_version=self._engine_version(), learner_version=learner,
                         outstanding=len(self.in_flight) + len(self.done), in_flight=len(self.in_flight),
                         batch_size=self.batch_size, max_staleness=self.max_staleness,
                         max_in_flight=self.max_in_flight)

    def _engine_version(self) -> int:
        version = self.runner.backend.version
        return int(version) if isinstance(version, int) else self.learner_version()

    def _launch(self, seq: int) -> None:
        group = Group(seq, self.sampler.problem_at(seq), self._engine_version())
        group.task = asyncio.ensure_future(self._run(group))
        group.task.add_done_callback(lambda task, g=group: self._ended(g, task))
        self.in_flight.append(group)
        self.started.append(seq)

    async def _run(self, group: Group) -> Rollouts:
        seed = step_seed(self.cfg.dataset.seed, group.seq, "group")
        size = self.cfg.dataset.group_size
        backend = self.runner.backend
        try:
            return await self.runner.run_groups([group.problem], size, group.version, seed, self.on_turn)
        except BackendError as exc:
            async with self._restarting:  # the first group that finds the engine dead restarts it
                if self.runner.backend is backend:
                    await asyncio.to_thread(self.restart, exc)
            log.warning("the group of %s (#%d) is redone on the fresh rollout worker", group.problem.key, group.seq)
            return await self.runner.run_groups([group.problem], size, group.version, seed, self.on_turn)

    def _ended(self, group: Group, task: asyncio.Task) -> None:
        if group not in self.in_flight:
            return  # dropped while in flight
        self.in_flight.remove(group)
        if task.cancelled():
            return
        if task.exception() is not None:
            self._failure = task.exception()  # the run fails with it at its next take
        else:
            group.rollouts, group.ended = task.result(), time.time()
            self.done.append(group)
        self._changed.set()

    def _older_than(self, version: int) -> list[Group]:
        return [g for g in self.in_flight if version - g.version > self.max_staleness]

    def _drop(self, stale: list[Group], doomed: list[Group]) -> None:
        if not (stale or doomed):
            return
        for group in doomed:
            self.in_flight.remove(group)
            group.task.cancel()
        self.done = [g for g in self.done if g not in stale]
        self._dropped_now += len(stale) + len(doomed)
        self.dropped_total += len(stale) + len(doomed)
        log.info("dropped %d group(s) more than rollout.max_staleness=%d versions behind the learner",
                 len(stale) + len(doomed), self.max_staleness)

    async def _wait(self, timeout: float | None = None) -> None:
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)


def _merged(groups: list[Group]) -> RolloutStats:
    """One step's statistics from its groups' own: sums, and the wall time from the first start to the last end."""
    out = RolloutStats()
    for g in groups:
        s = g.rollouts.stats
        out.generate_s += s.generate_s
        out.eval_sum_s += s.eval_sum_s
        out.evaluated += s.evaluated
        out.cache_hits += s.cache_hits
    if groups:
        out.wall_s = max(g.ended for g in groups) - min(g.started for g in groups)
    return out
