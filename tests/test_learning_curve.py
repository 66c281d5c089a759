"""The learning-curve bench's statistics (the run itself is bench/learning_curve.py: ~25 CPU minutes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("learning_curve", Path(__file__).parent.parent / "bench" / "learning_curve.py")
lc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(lc)


def rows(per_step: list[list[float]]) -> list[dict]:
    return [{"step": s, "score": x} for s, xs in enumerate(per_step, 1) for x in xs]


def test_quarters_take_the_first_and_last_quarter_of_the_steps():
    first, last = lc.quarters(rows([[0, 1], [0, 0], [1, 1], [2, 2], [5, 5], [1, 0], [1, 1], [3, 4]]))
    assert first == [0, 1, 0, 0] and last == [1, 1, 3, 4]  # 8 steps -> 2 each
    first, last = lc.quarters(rows([[0], [1], [2]]))  # fewer than 4 steps: one step each
    assert first == [0] and last == [2]


def test_bootstrap_delta():
    delta, lo, hi = lc.bootstrap_delta([0.0] * 10, [1.0] * 10, reps=500, seed=0)
    assert (delta, lo, hi) == (1.0, 1.0, 1.0)  # no spread, no uncertainty
    first, last = [0.0, 1.0] * 20, [0.0, 1.0] * 20
    delta, lo, hi = lc.bootstrap_delta(first, last, reps=2000, seed=0)
    assert delta == 0.0 and lo < 0 < hi
    # standard error of the difference of two 40-sample means of a fair coin: sqrt(2 * 0.25 / 40) = 0.112;
    # the 95% interval is about +-1.96 x 0.112 = +-0.22
    assert hi - lo == pytest.approx(2 * 1.96 * 0.112, rel=0.15)
