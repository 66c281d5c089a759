"""`kforge problems generate --verify`: every generated solution through kforge's own judge (the evaluator
pool, as `kforge check` judges one file) before the folder is written, so a curriculum never teaches a kernel
its judge would refuse."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from kforge.problems.record import Problem

if TYPE_CHECKING:
    from kforge.evaluator import EvalPool, Verdict


def problems_of(rows: list[dict], source: str) -> list[Problem]:
    """A curriculum's problem rows as Problems (solution and split included)."""
    return [Problem.from_dict({**row, "source": source}) for row in rows]


def judge_solutions(pool: EvalPool, problems: list[Problem],
                    each: Callable[[Problem, Verdict], None]) -> list[tuple[Problem, Verdict]]:
    """Submit every problem's solution to `pool` at once (timing off) and return the (problem, verdict) of the
    ones it does not accept, in key order; `each(problem, verdict)` hears of every verdict as it is read."""
    futures = [(p, pool.submit(p, p.solution or "", "triton", measure=False)) for p in problems]
    refused = []
    for problem, future in futures:
        verdict = future.result()
        each(problem, verdict)
        if not verdict.correct:
            refused.append((problem, verdict))
    return refused
