"""bench/learning_stats.py on data whose answer is known: a clear gain is significant, identical arms give
p = 1, the intervals match their textbook values, autocorrelated steps are not taken as independent, and the
sample size for 20 % -> 30 % is the standard formula's 231."""

from __future__ import annotations

import random

import pytest

from bench import learning_stats as st


def test_wilson_matches_the_textbook_interval():
    assert st.wilson(20, 100) == pytest.approx((0.1334, 0.2888), abs=1e-4)
    assert st.wilson(0, 10)[0] == pytest.approx(0.0) and st.wilson(10, 10)[1] == pytest.approx(1.0)
    assert st.wilson(0, 0) == (0.0, 1.0)


def test_mcnemar_is_the_exact_sign_test_of_the_discordant_pairs():
    a = [True] * 12 + [False] * 8 + [True] * 30
    b = [False] * 12 + [True] * 8 + [True] * 30  # 12 for a, 8 for b, 30 concordant
    got = st.mcnemar_greater(a, b)
    assert (got["a_only"], got["b_only"]) == (12, 8)
    assert got["p"] == pytest.approx(263950 / 2 ** 20)  # sum of C(20, k) for k >= 12, over 2^20
    assert st.mcnemar_greater(a, a)["p"] == 1.0  # identical arms
    assert st.mcnemar_greater(b, a)["p"] > 0.5  # the other direction
    with pytest.raises(ValueError):
        st.mcnemar_greater(a, b[:-1])


def _arms(rate_real: float, rate_control: float, n: int, seed: int = 1) -> tuple[list[bool], list[bool]]:
    rng = random.Random(seed)
    return [rng.random() < rate_real for _ in range(n)], [rng.random() < rate_control for _ in range(n)]


def test_a_clear_gain_on_240_paired_requests_is_significant_and_its_interval_excludes_zero():
    real, control = _arms(0.45, 0.20, 240)
    assert st.mcnemar_greater(real, control)["p"] < 0.01
    clusters = [f"1/{i // 4}" for i in range(240)]  # 60 problems x 4 samples
    diff = st.paired_difference(real, control, clusters, seed=0)
    assert 0 < diff["low"] < diff["diff"] < diff["high"] and diff["clusters"] == 60
    same = st.paired_difference(real, real, clusters)
    assert (same["diff"], same["low"], same["high"]) == (0.0, 0.0, 0.0)


def test_the_paired_interval_widens_when_a_problems_samples_move_together():
    """The same per-request differences, once spread over 240 problems and once as 12 problems whose 20
    samples agree: the clustered interval must be wider (each problem is one draw, not 20)."""
    diffs = [1] * 72 + [0] * 168
    spread = st.paired_difference([bool(d) for d in diffs], [False] * 240, None, seed=0)
    lumped = st.paired_difference([bool(d) for d in diffs], [False] * 240, [f"1/{i // 20}" for i in range(240)], seed=0)
    assert spread["diff"] == lumped["diff"] == pytest.approx(0.3)
    assert lumped["high"] - lumped["low"] > 1.5 * (spread["high"] - spread["low"])


def test_the_block_bootstrap_sees_a_steady_gain_and_no_gain():
    rng = random.Random(0)
    gain = [0.15 + rng.gauss(0, 0.05) for _ in range(30)]
    assert st.block_bootstrap_greater(gain, seed=1)["p"] < 0.01
    assert st.block_bootstrap_greater([0.0] * 30)["p"] == 1.0
    noise = [rng.gauss(0, 0.1) for _ in range(30)]
    assert st.block_bootstrap_greater([x - sum(noise) / 30 + 0.001 for x in noise], seed=1)["p"] > 0.2
    assert st.block_bootstrap_greater(gain)["block"] == 4  # ceil(30 ** (1/3))


def test_the_block_bootstrap_is_more_cautious_than_independent_steps_on_a_drifting_series():
    """A slow wave (strongly autocorrelated steps) with a small positive mean: blocks of 6 steps keep the
    dependence and give a wider interval than blocks of one step (the bootstrap of independent steps)."""
    wave = [0.02 + 0.2 * ((i // 6) % 2 * 2 - 1) for i in range(36)]
    blocks = st.block_bootstrap_greater(wave, block=6, seed=3)
    steps = st.block_bootstrap_greater(wave, block=1, seed=3)
    assert blocks["high"] - blocks["low"] > steps["high"] - steps["low"]


def test_samples_per_arm_for_20_to_30_percent_is_231():
    assert st.samples_per_arm(0.2, 0.3) == 231  # one-sided alpha 0.05, power 0.8
    assert st.samples_per_arm(0.2, 0.3, one_sided=False) == 294
    assert st.samples_per_arm(0.2, 0.4) < 100


def test_outcomes_error_mix_and_correct_among_compiled():
    verdicts = [None, {"status": "format_error"}, {"status": "compile_error"}, {"status": "static_check_failed"},
                {"status": "incorrect"}, {"status": "runtime_error"}, {"status": "correct", "flags": ["pytorch_op"]},
                {"status": "correct", "flags": []}]
    got = [st.outcome(v) for v in verdicts]
    assert got == ["format", "format", "compile", "compile", "incorrect", "incorrect", "incorrect", "correct"]
    mix = st.error_mix(got)
    assert (mix["format"], mix["compile"], mix["incorrect"], mix["correct"], mix["n"]) == (2, 2, 3, 1, 8)
    assert mix["correct_among_compiled"] == pytest.approx(0.25)


def test_the_held_out_report_pairs_requests_every_arm_answered():
    requests = [(f"1/{p}", s) for p in range(1, 61) for s in range(4)]
    real, shuffled = _arms(0.5, 0.2, 240, seed=2)
    arms = {"real": {r: "correct" if ok else "incorrect" for r, ok in zip(requests, real)},
            "shuffled": {r: "correct" if ok else "compile" for r, ok in zip(requests, shuffled)},
            "control": {r: "correct" if ok else "format" for r, ok in zip(requests, real)}}
    del arms["control"][("1/7", 0)]  # a request one arm lacks is left out of every comparison
    rep = st.heldout_report(arms)
    assert rep["requests"]["n"] == 239 and rep["arms"]["real"]["n"] == 239
    assert rep["vs"]["shuffled"]["mcnemar"]["p"] < 0.01
    assert rep["vs"]["control"]["mcnemar"]["p"] == 1.0  # the same outcomes as real
    arm = rep["arms"]["shuffled"]
    assert arm["low"] < arm["rate"] < arm["high"] and arm["mix"]["format"] == 0 and arm["mix"]["compile"] > 0
