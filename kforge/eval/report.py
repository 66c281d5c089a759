"""KernelBench-style summary numbers from verdicts, per level and overall.

Definitions (every rate is over ALL selected problems of the group, so a problem with no kernel counts as
a failure; with k samples per problem a number is first averaged over a problem's samples, then over
problems, so k = 1 gives exactly KernelBench's figure):

- correctness (= fast_0): the kernel passed every correctness trial and carries no reward-hacking flag.
- fast_p (KernelBench): correct AND speedup = baseline time / kernel time > p, for p in FAST_PS; 1.2 is the
  threshold recent papers report (Fast@1.2).
- mean_speedup, geomean_speedup: over the correct, timed samples only (None when there are none).
- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) over a problem's n samples with c correct,
  for every k from 1 to the number of samples.
- first_turn_*: the kernel of turn 1 alone; best_of_turns_*: the best kernel across all turns of the
  sample (the "best candidate across turns" figure of multi-turn papers). Equal in single-turn evals.
- compile_rate: the sample's kernel compiled and ran; flagged_rate: a hacking check flagged it.
- timed: whether any correct sample was timed (False on a CPU, where fast_p for p > 0 is 0).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from kforge.evaluator.verdict import Verdict

if TYPE_CHECKING:
    from kforge.policy.records import Trajectory

FAST_PS = (0.0, 0.5, 0.8, 1.0, 1.2, 1.5, 2.0)
# The per-turn figures multi-turn papers compare: correctness and the Fast@1.2 threshold.
TURN_PS = (0.0, 1.2)

Summary = dict[str, float | int | bool | None]


class _SingleTurn:
    """Marks an outcome built without a turn-1 verdict: its only turn is its best."""


SINGLE_TURN = _SingleTurn()


@dataclass
class SampleOutcome:
    """One sample (a single- or multi-turn attempt) at one problem."""

    problem_key: str
    level: int
    verdict: Verdict | None  # the best across turns; None = nothing evaluable (format error at every turn)
    # Turn 1 alone; None = turn 1 had nothing evaluable (even when a later turn did).
    first_verdict: Verdict | None | _SingleTurn = SINGLE_TURN

    @property
    def first(self) -> Verdict | None:
        return self.verdict if isinstance(self.first_verdict, _SingleTurn) else self.first_verdict


def trajectory_outcome(traj: "Trajectory", level: int) -> SampleOutcome:
    """A trajectory as one KernelBench sample: its best verdict across turns and its first turn's."""
    return SampleOutcome(traj.problem_key, level, traj.best_verdict, traj.turns[0].verdict if traj.turns else None)


def fast_key(p: float) -> str:
    """fast_0, fast_0.5, fast_1, fast_1.2, ... (the summary's key for threshold p)."""
    return f"fast_{p:g}"


def summary_keys(max_k: int = 1) -> tuple[str, ...]:
    """Every key a group of `summarize` holds, in display order (pass@k up to `max_k`)."""
    turn_keys = []
    for p in TURN_PS:
        name = "correctness" if p == 0 else fast_key(p)
        turn_keys += [f"first_turn_{name}", f"best_of_turns_{name}"]
    return (
        "n_problems", "n_samples", "correctness", *(fast_key(p) for p in FAST_PS), "mean_speedup", "geomean_speedup",
        *(f"pass@{k}" for k in range(1, max_k + 1)), *turn_keys, "compile_rate", "flagged_rate", "timed",
    )


def is_speed_key(key: str) -> bool:
    """A summary number that needs timed kernels: fast_p for p > 0 (also per turn) and the speedup means."""
    name = key.removeprefix("first_turn_").removeprefix("best_of_turns_")
    return name.endswith("_speedup") or (name.startswith("fast_") and name != "fast_0")


def speed_measured(summary: Summary) -> bool:
    """Whether the group's speed numbers were measured: some correct kernel was timed. Where none was (a CPU, or
    no correct kernel to time) they are "not measured" (`-`), not a fast_1 of 0 that no clock gave. A summary
    written before `timed` was recorded is taken as measured."""
    return bool(summary.get("timed", True))


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


def summarize(outcomes: Iterable[SampleOutcome]) -> dict[str, Summary]:
    """{"overall": {...}, "level_1": {...}, ...}: every key of `summary_keys`; pass@k for every k from 1 to the
    fewest samples any problem of the group has (the one pass@k rule: results files, splits, compare)."""
    outcomes = list(outcomes)
    groups: dict[str, list[SampleOutcome]] = {"overall": outcomes}
    for o in sorted(outcomes, key=lambda o: o.level):
        groups.setdefault(f"level_{o.level}", []).append(o)
    return {name: _summary(items) for name, items in groups.items()}


def _summary(outcomes: list[SampleOutcome]) -> Summary:
    by_problem: dict[str, list[SampleOutcome]] = defaultdict(list)
    for o in outcomes:
        by_problem[o.problem_key].append(o)
    n_problems = len(by_problem)
    out: Summary = {"n_problems": n_problems, "n_samples": len(outcomes)}
    if n_problems == 0:
        return out

    def rate(pred: Callable[[SampleOutcome], bool]) -> float:
        return sum(sum(pred(o) for o in items) / len(items) for items in by_problem.values()) / n_problems

    for p in FAST_PS:
        out[fast_key(p)] = rate(lambda o, p=p: _fast(o.verdict, p))
    out["correctness"] = out["fast_0"]
    speedups = [o.verdict.speedup for o in outcomes if _fast(o.verdict, 0.0) and o.verdict.speedup]
    out["mean_speedup"] = sum(speedups) / len(speedups) if speedups else None
    out["geomean_speedup"] = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None

    # pass@k needs k samples of every problem in the group: k runs up to the fewest samples any problem has.
    fewest = min(len(items) for items in by_problem.values())
    for k in range(1, fewest + 1):
        per_problem = [pass_at_k(len(items), sum(_fast(o.verdict, 0.0) for o in items), k) for items in by_problem.values()]
        out[f"pass@{k}"] = sum(per_problem) / n_problems

    for p in TURN_PS:
        name = "correctness" if p == 0 else fast_key(p)
        out[f"first_turn_{name}"] = rate(lambda o, p=p: _fast(o.first, p))
        out[f"best_of_turns_{name}"] = rate(lambda o, p=p: _fast(o.verdict, p))
    out["compile_rate"] = rate(lambda o: o.verdict is not None and o.verdict.status.compiled)
    out["flagged_rate"] = rate(lambda o: o.verdict is not None and bool(o.verdict.flags))
    out["timed"] = bool(speedups)
    return out


def outcomes_from_samples(records: Iterable[dict]) -> list[SampleOutcome]:
    """The outcomes of a results file's `samples` (best verdict across turns and turn 1's)."""
    out = []
    for rec in records:
        best = Verdict.from_dict(rec["verdict"]) if rec.get("verdict") else None
        first = rec["turns"][0].get("verdict") if rec.get("turns") else None
        out.append(SampleOutcome(rec["problem_key"], rec["level"], best, Verdict.from_dict(first) if first else None))
    return out
