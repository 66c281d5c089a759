"""The statistics of the learning bench (bench/learning_gpu.py), declared before any run. Pure functions of
per-request outcomes and per-step curves; standard library only.

Primary test (held out): each arm is evaluated on the same requests (problem, sample index), with the same
sampling seed, so outcomes pair up. Real vs each control: the exact one-sided McNemar test (a sign test on
the discordant pairs: real right where the control was wrong, and the reverse), a Wilson interval of each
arm's correct rate, and a bootstrap interval of the paired difference that resamples whole problems (the
samples of one problem are not independent of each other).

Secondary test (training curve): per step, the real arm's rate minus the control's. Steps are autocorrelated
(each starts from the weights the one before left), so the mean difference is judged by a moving-block
bootstrap, not by a t-test that takes the steps as independent.
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist
from typing import Iterable, Mapping, Sequence

OUTCOMES = ("format", "compile", "incorrect", "correct")


def wilson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion; (0, 1) for no samples."""
    if n == 0:
        return 0.0, 1.0
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def binom_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly."""
    return sum(math.comb(n, i) for i in range(max(k, 0), n + 1)) / 2 ** n if n else 1.0


def mcnemar_greater(a: Sequence[bool], b: Sequence[bool]) -> dict[str, float]:
    """Exact one-sided McNemar test that arm a's correct rate exceeds arm b's on paired outcomes: of the
    discordant pairs, `a_only` (a right, b wrong) against `b_only`; p = P(Binomial(a_only + b_only, 1/2) >=
    a_only). Identical arms have no discordant pair: p = 1."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} and {len(b)}")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    return {"n": float(len(a)), "a_only": float(a_only), "b_only": float(b_only),
            "p": binom_tail(a_only, a_only + b_only)}


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, int(math.floor(q * (len(sorted_values) - 1) + 0.5))))
    return sorted_values[i]


def paired_difference(a: Sequence[bool], b: Sequence[bool], clusters: Sequence[str] | None = None,
                      reps: int = 4000, seed: int = 0, confidence: float = 0.95) -> dict[str, float]:
    """Mean of a - b over paired outcomes, with a percentile bootstrap interval that resamples clusters
    (problems: their samples travel together; each request its own cluster when None)."""
    if len(a) != len(b) or (clusters is not None and len(clusters) != len(a)):
        raise ValueError("paired outcomes and their clusters must have one entry per request")
    groups: dict[str, list[float]] = {}
    for i, (x, y) in enumerate(zip(a, b)):
        groups.setdefault(clusters[i] if clusters is not None else str(i), []).append(float(x) - float(y))
    sums = [(sum(d), len(d)) for d in groups.values()]
    n = len(a)
    mean = sum(s for s, _ in sums) / n if n else 0.0
    rng = random.Random(seed)
    means = []
    for _ in range(reps if sums else 0):
        pick = [sums[rng.randrange(len(sums))] for _ in sums]
        means.append(sum(s for s, _ in pick) / sum(m for _, m in pick))
    means.sort()
    tail = (1 - confidence) / 2
    low, high = (_percentile(means, tail), _percentile(means, 1 - tail)) if means else (0.0, 0.0)
    return {"diff": mean, "low": low, "high": high, "clusters": float(len(sums))}


def block_bootstrap_greater(diffs: Sequence[float], block: int | None = None, reps: int = 4000,
                            seed: int = 0, confidence: float = 0.95) -> dict[str, float]:
    """One-sided moving-block bootstrap test that the mean of a per-step difference series exceeds 0.

    Blocks of `block` consecutive steps (default: the cube root of the length, rounded up) are drawn with
    replacement until the series' length is filled, which keeps the dependence between nearby steps. p is
    the share of resampled means, centred on the observed one, at or above the observed mean (+1 smoothing);
    a series of zeros gives p = 1."""
    d = list(diffs)
    n = len(d)
    if n == 0:
        return {"n": 0.0, "mean_diff": 0.0, "low": 0.0, "high": 0.0, "block": 0.0, "p": 1.0}
    size = max(1, min(n, block if block is not None else math.ceil(n ** (1 / 3))))
    observed = sum(d) / n
    starts = n - size + 1
    rng = random.Random(seed)
    means = []
    for _ in range(reps):
        series: list[float] = []
        while len(series) < n:
            s = rng.randrange(starts)
            series.extend(d[s:s + size])
        means.append(sum(series[:n]) / n)
    means.sort()
    at_least = sum(1 for m in means if m - observed >= observed - 1e-12)
    tail = (1 - confidence) / 2
    return {"n": float(n), "mean_diff": observed, "low": _percentile(means, tail),
            "high": _percentile(means, 1 - tail), "block": float(size),
            "p": 1.0 if observed <= 0 else (1 + at_least) / (reps + 1)}


def samples_per_arm(p0: float, p1: float, alpha: float = 0.05, power: float = 0.8, one_sided: bool = True) -> int:
    """Samples per arm for a two-proportion test to see p0 -> p1 (normal approximation, unpooled power
    term). Conservative for a paired design, whose discordant pairs carry the test: 231 for 0.2 -> 0.3 at
    80 % power and one-sided alpha 0.05."""
    z_a = NormalDist().inv_cdf(1 - (alpha if one_sided else alpha / 2))
    z_b = NormalDist().inv_cdf(power)
    bar = (p0 + p1) / 2
    need = (z_a * math.sqrt(2 * bar * (1 - bar)) + z_b * math.sqrt(p0 * (1 - p0) + p1 * (1 - p1))) ** 2
    return math.ceil(need / (p1 - p0) ** 2)


def outcome(verdict: Mapping | None) -> str:
    """A results file's verdict as one of OUTCOMES: no kernel block (or none at all) is format; rejected
    before it ran or failed to build is compile; it ran but is wrong, crashed, timed out or is flagged is
    incorrect."""
    status = (verdict or {}).get("status")
    if status in (None, "format_error"):
        return "format"
    if status in ("static_check_failed", "compile_error", "unsupported"):
        return "compile"
    if status == "correct" and not (verdict or {}).get("flags"):
        return "correct"
    return "incorrect"


def error_mix(outcomes: Iterable[str]) -> dict[str, float]:
    """Counts of each outcome, and the correct rate among kernels that compiled (incorrect + correct)."""
    counts = {k: 0 for k in OUTCOMES}
    for o in outcomes:
        counts[o] += 1
    compiled = counts["incorrect"] + counts["correct"]
    return {**{k: float(v) for k, v in counts.items()}, "n": float(sum(counts.values())),
            "correct_among_compiled": counts["correct"] / compiled if compiled else 0.0}


def pair_requests(arms: Mapping[str, Mapping[tuple[str, int], str]]) -> tuple[list[tuple[str, int]], list[str]]:
    """(the requests every arm answered, sorted; the arms' names): only requests present in every arm pair up."""
    names = list(arms)
    common = set.intersection(*(set(arms[n]) for n in names)) if names else set()
    return sorted(common, key=lambda r: (r[0].split("/")[0], int(r[0].split("/")[-1]), r[1])), names


def heldout_report(arms: Mapping[str, Mapping[tuple[str, int], str]], real: str = "real",
                   seed: int = 0) -> dict[str, dict]:
    """Per arm: correct rate with its Wilson interval and its error mix; per control: the paired test of
    `real` against it and the interval of the paired difference (problems as clusters)."""
    requests, names = pair_requests(arms)
    report: dict[str, dict] = {"arms": {}, "vs": {}, "requests": {"n": len(requests)}}
    for name in names:
        got = [arms[name][r] for r in requests]
        hits = sum(1 for o in got if o == "correct")
        low, high = wilson(hits, len(got))
        report["arms"][name] = {"correct": hits, "n": len(got), "rate": hits / len(got) if got else 0.0,
                                "low": low, "high": high, "mix": error_mix(got)}
    ok = {n: [arms[n][r] == "correct" for r in requests] for n in names}
    for name in names:
        if name != real:
            report["vs"][name] = {"mcnemar": mcnemar_greater(ok[real], ok[name]),
                                  "difference": paired_difference(ok[real], ok[name], [r[0] for r in requests],
                                                                  seed=seed)}
    return report
