"""KernelBench-style summary numbers from verdicts.

fast_p (KernelBench's definition) = the fraction of ALL selected problems whose kernel is correct AND
has speedup = baseline_time / kernel_time > p; fast_0 is the correctness rate. With k samples per problem
every number is first averaged over a problem's samples, then over problems, so k = 1 gives exactly
KernelBench's figure. A flagged (reward-hacking) kernel is never correct. On a machine where timing is
not meaningful (CPU), speedups are None and fast_p for p > 0 is 0 with `timed` false.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

from kforge.evaluator.verdict import Verdict

FAST_PS = (0.0, 1.0, 2.0)


@dataclass
class SampleOutcome:
    """One sample (a single- or multi-turn attempt) at one problem."""

    problem_key: str
    level: int
    verdict: Verdict | None  # None = nothing evaluable (format error at every turn)
    first_verdict: Verdict | None = None  # turn 1 alone, for best-of-turns comparisons


def _fast(v: Verdict | None, p: float) -> bool:
    if v is None or not v.correct:
        return False
    if p == 0.0:
        return True
    return v.speedup is not None and v.speedup > p


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(outcomes: Iterable[SampleOutcome], ks: tuple[int, ...] = (1,)) -> dict[str, dict[str, float | int | bool | None]]:
    """{"overall": {...}, "level_1": {...}, ...}."""
    outcomes = list(outcomes)
    groups: dict[str, list[SampleOutcome]] = {"overall": outcomes}
    for o in outcomes:
        groups.setdefault(f"level_{o.level}", []).append(o)
    return {name: _summary(items, ks) for name, items in groups.items()}


def _summary(outcomes: list[SampleOutcome], ks: tuple[int, ...]) -> dict[str, float | int | bool | None]:
    by_problem: dict[str, list[SampleOutcome]] = defaultdict(list)
    for o in outcomes:
        by_problem[o.problem_key].append(o)
    n_problems = len(by_problem)
    out: dict[str, float | int | bool | None] = {"n_problems": n_problems, "n_samples": len(outcomes)}
    if n_problems == 0:
        return out

    def per_problem_mean(pred) -> float:
        return sum(sum(pred(o) for o in items) / len(items) for items in by_problem.values()) / n_problems

    for p in FAST_PS:
        out[f"fast_{p:g}"] = per_problem_mean(lambda o, p=p: _fast(o.verdict, p))
    out["correctness"] = out["fast_0"]
    out["first_turn_correctness"] = per_problem_mean(lambda o: _fast(o.first_verdict or o.verdict, 0.0))
    out["compiled"] = per_problem_mean(lambda o: o.verdict is not None and o.verdict.status.compiled)
    out["flagged"] = per_problem_mean(lambda o: o.verdict is not None and bool(o.verdict.flags))
    for k in ks:
        vals = []
        for items in by_problem.values():
            n, c = len(items), sum(_fast(o.verdict, 0.0) for o in items)
            if k <= n:
                vals.append(pass_at_k(n, c, k))
        out[f"pass@{k}"] = sum(vals) / len(vals) if vals else None
    speedups = [o.verdict.speedup for o in outcomes if _fast(o.verdict, 0.0) and o.verdict.speedup]
    out["timed"] = bool(speedups)
    out["mean_speedup"] = sum(speedups) / len(speedups) if speedups else None
    out["geomean_speedup"] = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    return out
