"""`kforge eval`: generate kernels for KernelBench-format problems (or take given ones), evaluate them in the
sandboxed pool and write a results file whose numbers mean what KernelBench's mean.

The results file is rewritten atomically after every finished sample, so an interrupted eval loses at most
the samples in flight, and `--resume` continues without redoing finished ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kforge.config.schema import KforgeConfig
from kforge.eval.parts import EvalParts
from kforge.eval.report import SampleOutcome, outcomes_from_samples, summarize
from kforge.eval.results import write_results
from kforge.eval.target import Target
from kforge.evaluator.verdict import Verdict
from kforge.problems.record import Problem

if TYPE_CHECKING:
    from kforge.evaluator import EvalPool
    from kforge.policy.records import Trajectory, Turn

log = logging.getLogger("kforge.eval")


# A results file is rewritten after every sample: a candidate's code is kept up to this many characters
# (a real kernel is far smaller), with its length and hash, so one 60 MB file does not make every write 60 MB.
CODE_KEEP_CHARS = 256 * 1024


def kept_code(code: str | None) -> dict[str, Any]:
    """The `code` of a results file's turn, cut at CODE_KEEP_CHARS with its full length and sha256 noted."""
    if code is None or len(code) <= CODE_KEEP_CHARS:
        return {"code": code}
    digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    return {"code": code[:CODE_KEEP_CHARS], "code_chars": len(code), "code_sha256": digest, "code_cut": True}


WRITE_EVERY_S = 2.0  # the results file is rewritten at most this often while verdicts arrive (and at the end)


@dataclass
class EvalRun:
    cfg: KforgeConfig
    problems: list[Problem]
    out_path: Path
    samples: int = 1
    target: Target | None = None
    candidates: list[tuple[Problem, int, str]] | None = None
    on_progress: Callable[[str, int, int], None] | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # what the numbers mean, kept in every write
    results: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    _written_at: float = field(default=float("-inf"), repr=False)  # when the results file was last written

    def keep_previous(self, data: dict[str, Any]) -> int:
        """--resume: keep the finished samples of the earlier results file (read and checked by the plan)."""
        for rec in data.get("samples", []):
            self.results[(rec["problem_key"], rec["sample"])] = rec
        return len(self.results)

    def _record(self, problem: Problem, sample: int, turns: list[dict[str, Any]], best: Verdict | None) -> None:
        self.results[(problem.key, sample)] = {
            "problem_key": problem.key, "level": problem.level, "name": problem.name, "sample": sample,
            "turns": turns, "verdict": best.to_dict() if best is not None else None,
        }
        # The whole file (its summary over every sample) is written again each time: once per sample made
        # a 256-sample eval write it 256 times in a row when a batch's verdicts came back together.
        if time.monotonic() - self._written_at >= WRITE_EVERY_S:
            self.write()

    def outcomes(self) -> list[SampleOutcome]:
        return outcomes_from_samples(self.results.values())

    def summary(self) -> dict[str, Any]:
        return summarize(self.outcomes())

    def write(self) -> None:
        ordered = sorted(self.results.values(), key=lambda r: (r["level"], int(r["problem_key"].split("/")[1]), r["sample"]))
        doc = {
            "summary": self.summary(),
            "target": self.target.description if self.target else "given candidates",
            "model": self.target.model if self.target else None,
            "adapter": self.target.adapter if self.target else None,
            "backend": self.cfg.dataset.backend,
            "turns": self.cfg.turns,
            "samples_per_problem": self.samples,
            "machine": platform.node(),
            "time": time.time(),
            "config": self.cfg.model_dump(mode="json"),
            **self.meta,
            "samples": ordered,
        }
        write_results(self.out_path, doc)
        self._written_at = time.monotonic()

    def work(self) -> tuple[int, str]:
        """What the progress counts, known from the plan before anything starts: the given kernels left, or the
        samples left to generate (each of their turns when a sample has several), and what to call them. Every
        stage shows `done/total` of it, the first ones too: for the minute a model loaded and generated its
        first batch, the line said `0/0`, then no count at all, nothing of how much was ahead."""
        if self.candidates is not None:
            return len(self._given_todo()), "kernels"
        if self.cfg.turns > 1:
            return len(self.pending()) * self.cfg.turns, "turns"
        return len(self.pending()), "problems" if self.samples == 1 else "samples"

    def _tell(self, stage: str, done: int, total: int) -> None:
        if self.on_progress:
            self.on_progress(stage, done, total)

    def pending(self) -> list[tuple[Problem, int]]:
        """The (problem, sample) requests a generating eval still has to make (none done: all of them)."""
        return [(p, s) for p in self.problems for s in range(self.samples) if (p.key, s) not in self.results]

    def _given_todo(self) -> list[tuple[Problem, int, str]]:
        return [(p, i, code) for p, i, code in (self.candidates or []) if (p.key, i) not in self.results]

    async def _evaluate_given(self, pool: "EvalPool") -> None:
        todo = self._given_todo()
        done = 0
        self._tell("evaluating", 0, len(todo))

        async def one(p: Problem, i: int, code: str) -> None:
            nonlocal done
            verdict = await pool.evaluate(p, code, self.cfg.dataset.backend)
            self._record(p, i, [{"turn": 1, **kept_code(code), "verdict": verdict.to_dict()}], verdict)
            done += 1
            self._tell("evaluating", done, len(todo))

        await asyncio.gather(*(one(*item) for item in todo))

    async def _generate_and_evaluate(self, parts: EvalParts) -> None:
        from kforge.credit.rewards import score_trajectories

        jobs = self.pending()
        if not jobs:
            return
        assert parts.runner is not None and parts.backend is not None, "a generating eval's parts have a runner"
        by_key = {p.key: p for p in self.problems}
        per_sample = self.cfg.turns
        done, total = 0, len(jobs) * per_sample  # work()'s count, in turns

        def on_turn(traj: Trajectory, turn: Turn) -> None:
            nonlocal done
            # A sample that stops early (solved, or failed too often) counts the turns it will not play: the
            # count ends at the total it showed from the start.
            done += 1 if not traj.stop_reason else per_sample - turn.index
            self._tell("generate+evaluate", done, total)

        # Samples are recorded per batch of problems so an interruption keeps finished batches. An engine that
        # batches requests itself (vLLM) gets them all at once: in hf-sized chunks it sat idle while each
        # chunk's verdicts came back (on an H200 a 120-sample gate did 20 samples in 4.5 min; all at once, 120 in 2).
        chunk = len(jobs) if parts.backend.concurrent else max(1, self.cfg.rollout.hf_batch_size)
        for start in range(0, len(jobs), chunk):
            batch = jobs[start : start + chunk]
            if done == 0:  # until the first verdict, the line says what the engine is doing
                self._tell("generating", 0, total)
            rollouts = await parts.runner.run(batch, 1, self.cfg.dataset.seed, on_turn=on_turn)
            score_trajectories(rollouts.trajectories, self.cfg.reward, self.cfg.episode.thinking)
            for traj in rollouts.trajectories:
                turns = [{"turn": t.index + 1, **kept_code(t.candidate.code if t.candidate else None),
                          "response": t.response_text, "score": t.score,
                          "verdict": t.verdict.to_dict() if t.verdict else None} for t in traj.turns]
                self._record(by_key[traj.problem_key], traj.group_index, turns, traj.best_verdict)
            self.write()  # every finished batch is on disk before the next starts
            if done != (start + len(batch)) * per_sample:  # a sample cut by a full context reports no last turn
                done = (start + len(batch)) * per_sample
                self._tell("generate+evaluate", done, total)

    def run(self, parts: EvalParts) -> dict[str, Any]:
        """Generate (or take the given kernels), judge and write, on `parts` (eval/parts.py; the caller closes
        them). Returns the summary."""

        async def main() -> None:
            if self.candidates is not None:
                await self._evaluate_given(parts.pool)
            else:
                await self._generate_and_evaluate(parts)

        asyncio.run(main())
        self.write()
        return self.summary()
