"""The EpisodeRunner: problems in, trajectories with verdicts out (credit scores them). Training rollouts,
held-out evaluation during training and `kforge eval` all run episodes through one of these, built in one
place: `EpisodeRunner.from_config`.

Each `run` returns its own `RolloutStats`: what that phase cost (engine time, evaluation time, cache hits).
Nothing about a phase lives in shared fields, so in pipelined mode the next step's rollouts cannot
mix their numbers into the current step's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections import OrderedDict
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from kforge.evaluator.verdict import Verdict
from kforge.policy.episode import OnTurn, run_episodes
from kforge.policy.examples import ExampleRetriever
from kforge.policy.prompts import PromptBuilder
from kforge.policy.records import Trajectory, Turn
from kforge.problems.record import Problem
from kforge.rollout.base import Completion, GenerationRequest, OnCompletion, RolloutBackend

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig

JudgeFn = Callable[[Problem, str, str], Awaitable[Verdict]]  # the eval pool's evaluate(problem, code, backend)


@dataclass
class RolloutStats:
    """The cost of one rollout phase."""

    generate_s: float = 0.0  # summed over engine calls (they may overlap)
    eval_sum_s: float = 0.0  # summed over evaluations (they overlap)
    evaluated: int = 0  # candidates that went to the evaluator in this phase
    cache_hits: int = 0  # candidates answered from the verdict cache
    wall_s: float = 0.0


@dataclass
class InFlight:
    """What the runner's phases are waiting for right now: named when a stage stops moving."""

    generations: int = 0  # requests sent to the rollout engine and not answered
    evaluations: int = 0  # candidates sent to the eval pool without a verdict yet
    turns_done: int = 0  # turns finished so far (progress)

    def describe(self, engine: str) -> str:
        return (f"{self.generations} generation(s) from the rollout engine ({engine}) and "
                f"{self.evaluations} verdict(s) from the eval pool")


class EvaluatorStuck(RuntimeError):
    """The eval pool gave no verdict within its deadline."""


@dataclass
class Rollouts:
    trajectories: list[Trajectory]
    stats: RolloutStats


def code_hash(code: str) -> str:
    return hashlib.sha256(code.strip().encode()).hexdigest()


class VerdictCache:
    """Verdicts of kernel sources already evaluated for a problem, shared by the phases of a run (a policy
    often repeats itself) and bounded (least recently used entries go first), so it does not grow all run.
    In-flight evaluations are shared too: a second identical candidate waits for the first one's verdict."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], asyncio.Future] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, problem_key: str, code: str) -> asyncio.Future | None:
        key = (problem_key, code_hash(code))
        fut = self._entries.get(key)
        if fut is not None:
            # A failed evaluation is not an answer, nor is a verdict a failed reference spoiled (it is
            # retried after its back-off: the problem must not leave training for the rest of the run).
            if fut.done() and (fut.exception() is not None
                               or getattr(fut.result(), "details", {}).get("reference_error")):
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
        return fut

    def store(self, problem_key: str, code: str, fut: asyncio.Future) -> None:
        self._entries[(problem_key, code_hash(code))] = fut
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


@dataclass
class EpisodeRunner:
    backend: RolloutBackend
    builder: PromptBuilder
    judge: JudgeFn
    cfg: "KforgeConfig"
    cache: VerdictCache | None = field(default_factory=VerdictCache)
    inflight: InFlight = field(default_factory=InFlight)
    # Entered around every engine call (training: marks the rollout GPUs busy for timed runs to see).
    engine_busy: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
    # Awaited around every engine call (continuous rollouts: `EngineGate.passage`, shut during a colocated step).
    engine_gate: Callable[[], AbstractAsyncContextManager[object]] = contextlib.nullcontext

    @classmethod
    def from_config(cls, cfg: "KforgeConfig", backend: RolloutBackend, judge: JudgeFn,
                    retriever: ExampleRetriever | None = None, cache: bool = True) -> "EpisodeRunner":
        """The runner of training rollouts, held-out evaluation and `kforge eval`: prompts as the config asks
        (with `retriever` for prompt_option=raicl: `kforge.rag.retriever_for`), `judge` (the eval pool's
        evaluate), and a verdict cache unless every sample must be judged on its own (`kforge eval`)."""
        builder = PromptBuilder.from_config(cfg, backend.tokenizer, retriever=retriever)
        return cls(backend, builder, judge, cfg, VerdictCache() if cache else None)

    async def run(self, jobs: list[tuple[Problem, int]], policy_version: int, seed: int,
                  on_turn: OnTurn | None = None) -> Rollouts:
        """One trajectory per (problem, group index) job, in job order, with this phase's statistics."""
        stats = RolloutStats()
        t0 = time.time()
        def turn_done(trajectory: Trajectory, turn: Turn) -> None:
            self.inflight.turns_done += 1
            if on_turn is not None:
                on_turn(trajectory, turn)

        engine = _Timed(self.backend, stats, self.inflight, self.engine_busy, self.engine_gate)
        trajectories = await run_episodes(jobs, engine, self.builder, lambda p, c, b: self._evaluate(p, c, b, stats),
                                          self.cfg, policy_version, on_turn=turn_done, seed=seed)
        stats.wall_s = time.time() - t0
        return Rollouts(trajectories, stats)

    async def run_groups(self, problems: list[Problem], group_size: int, policy_version: int, seed: int,
                         on_turn: OnTurn | None = None) -> Rollouts:
        return await self.run([(p, g) for p in problems for g in range(group_size)], policy_version, seed, on_turn)

    async def _evaluate(self, problem: Problem, code: str, backend: str, stats: RolloutStats) -> Verdict:
        fut = self.cache.lookup(problem.key, code) if self.cache is not None else None
        if fut is not None:
            stats.cache_hits += 1
            return await asyncio.shield(fut)
        fut = asyncio.ensure_future(self._timed_judge(problem, code, backend, stats))
        if self.cache is not None:
            self.cache.store(problem.key, code, fut)
        return await asyncio.shield(fut)

    async def _timed_judge(self, problem: Problem, code: str, backend: str, stats: RolloutStats) -> Verdict:
        stats.evaluated += 1
        self.inflight.evaluations += 1
        t0 = time.time()
        deadline = self.cfg.evaluator.verdict_timeout_s
        try:
            return await asyncio.wait_for(self.judge(problem, code, backend), deadline)
        except asyncio.TimeoutError:
            raise EvaluatorStuck(f"the eval pool gave no verdict for a {problem.key} candidate within {deadline:g} s "
                                 "(evaluator.verdict_timeout_s)") from None
        finally:
            self.inflight.evaluations -= 1
            stats.eval_sum_s += time.time() - t0


class _Timed:
    """The rollout backend with the time spent in engine calls added to one phase's statistics."""

    def __init__(self, backend: RolloutBackend, stats: RolloutStats, inflight: InFlight,
                 busy: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
                 gate: Callable[[], AbstractAsyncContextManager[object]] = contextlib.nullcontext) -> None:
        self._backend, self._stats, self._inflight, self._busy, self._gate = backend, stats, inflight, busy, gate

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401  the backend's own attribute, as it is
        return getattr(self._backend, name)

    async def agenerate(self, requests: list[GenerationRequest], on_completion: OnCompletion | None = None) -> list[Completion]:
        async with self._gate():
            return await self._agenerate(requests, on_completion)

    async def _agenerate(self, requests: list[GenerationRequest], on_completion: OnCompletion | None) -> list[Completion]:
        t0 = time.time()
        self._inflight.generations += len(requests)
        try:
            with self._busy():
                return await self._backend.agenerate(requests, on_completion)
        finally:
            self._inflight.generations -= len(requests)
            self._stats.generate_s += time.time() - t0
