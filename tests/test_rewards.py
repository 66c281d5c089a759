"""Every reward component, with numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from kforge.config.loader import resolve
from kforge.config.schema import RewardConfig
from kforge.evaluator.verdict import Status, Verdict
from kforge.learner.rewards import COMPONENTS, SPEED_FLOOR, score_turn
from kforge.policy.records import Candidate, Turn


def make_turn(
    status: Status | None = Status.CORRECT,
    code: str | None = "class ModelNew: ...",
    trials_passed: int = 5,
    trials: int = 5,
    speedup: float | None = None,
    flags: list[str] | None = None,
    meaningful: bool = True,
    thinking: str | None = None,
    response_tokens: int = 10,
) -> Turn:
    verdict = None
    if status is not None:
        verdict = Verdict(
            status=status, trials_passed=trials_passed, trials=trials, speedup=speedup,
            flags=list(flags or []), timing_meaningful=meaningful,
        )
    return Turn(
        index=0, prompt_ids=[1, 2], response_ids=list(range(response_tokens)), response_text="",
        logprobs=[0.0] * response_tokens, policy_version=0,
        candidate=Candidate(problem_key="1/1", code=code, thinking=thinking), verdict=verdict,
    )


def weights_only(**kw: float) -> RewardConfig:
    base = dict(format_weight=0.0, compile_weight=0.0, correctness_weight=0.0, speed_weight=0.0,
                length_weight=0.0, thinking_weight=0.0)
    base.update(kw)
    return RewardConfig(**base)


def test_components_are_all_returned_and_sum_to_the_score():
    score, parts = score_turn(make_turn(speedup=2.0), RewardConfig(), thinking=False)
    assert set(parts) == set(COMPONENTS)
    assert score == pytest.approx(sum(parts.values()))
    # defaults: format 0.1 + compile 0.1 + correctness 1.0 + speed 1.0 * min(2 - 1, 3)
    assert parts == pytest.approx({"format": 0.1, "compile": 0.1, "correctness": 1.0, "speed": 1.0,
                                   "length": 0.0, "thinking": 0.0})
    assert score == pytest.approx(2.2)


def test_format_error_earns_nothing():
    turn = make_turn(status=Status.FORMAT_ERROR, code=None, trials_passed=0, trials=0)
    score, parts = score_turn(turn, RewardConfig(), thinking=False)
    assert parts["format"] == 0.0 and parts["compile"] == 0.0 and parts["correctness"] == 0.0
    assert score == 0.0


def test_compile_error_earns_only_format():
    turn = make_turn(status=Status.COMPILE_ERROR, trials_passed=0, trials=0)
    score, parts = score_turn(turn, RewardConfig(format_weight=0.2, compile_weight=0.3), thinking=False)
    assert parts["format"] == pytest.approx(0.2)
    assert parts["compile"] == 0.0
    assert score == pytest.approx(0.2)


def test_runtime_error_counts_as_compiled():
    turn = make_turn(status=Status.RUNTIME_ERROR, trials_passed=0, trials=5)
    _, parts = score_turn(turn, weights_only(compile_weight=0.5), thinking=False)
    assert parts["compile"] == pytest.approx(0.5)


def test_correctness_partial_credit():
    turn = make_turn(status=Status.INCORRECT, trials_passed=3, trials=5, speedup=4.0)
    score, parts = score_turn(turn, weights_only(correctness_weight=2.0, speed_weight=1.0), thinking=False)
    assert parts["correctness"] == pytest.approx(2.0 * 3 / 5)
    assert parts["speed"] == 0.0  # speed is for correct kernels only
    assert score == pytest.approx(1.2)


def test_speed_reward_fires_for_a_fast_correct_kernel():
    cfg = RewardConfig()  # the defaults, as a run would use them
    fast, fast_parts = score_turn(make_turn(speedup=1.8), cfg, thinking=False)
    same, same_parts = score_turn(make_turn(speedup=1.0), cfg, thinking=False)
    assert fast_parts["speed"] == pytest.approx(0.8)
    assert same_parts["speed"] == 0.0
    assert fast - same == pytest.approx(0.8)


@pytest.mark.parametrize(
    "speedup, expected",
    [(2.0, 1.0), (1.25, 0.25), (10.0, 3.0), (0.8, -0.2), (0.5, -0.5), (0.1, SPEED_FLOOR)],
)
def test_capped_speed(speedup, expected):
    _, parts = score_turn(make_turn(speedup=speedup), weights_only(speed_weight=1.0, speed_cap=3.0), thinking=False)
    assert parts["speed"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "speedup, expected",
    [(2.0, math.log(2.0)), (0.8, math.log(0.8)), (0.1, math.log(0.5)), (10.0, math.log(4.0))],
)
def test_log_speed(speedup, expected):
    cfg = weights_only(speed_weight=1.0, speed_form="log", speed_cap=3.0)
    _, parts = score_turn(make_turn(speedup=speedup), cfg, thinking=False)
    assert parts["speed"] == pytest.approx(expected)


def test_kevin_preset_means_point_three_correct_plus_speedup():
    cfg = resolve("kevin").config.reward
    assert cfg.speed_form == "kevin"
    score, parts = score_turn(make_turn(speedup=1.5), cfg, thinking=False)
    assert parts["correctness"] == pytest.approx(0.3)
    assert parts["speed"] == pytest.approx(1.5)
    assert score == pytest.approx(0.3 + 1.5)
    slow, _ = score_turn(make_turn(speedup=0.4), cfg, thinking=False)
    assert slow == pytest.approx(0.3 + 0.4)
    wrong, _ = score_turn(make_turn(status=Status.INCORRECT, trials_passed=0, speedup=2.0), cfg, thinking=False)
    assert wrong == 0.0
    huge, parts = score_turn(make_turn(speedup=50.0), cfg, thinking=False)
    assert parts["speed"] == pytest.approx(1.0 + cfg.speed_cap)


def test_flagged_kernel_gets_no_correctness_or_speed():
    turn = make_turn(speedup=3.0, flags=["calls_reference_op"])
    score, parts = score_turn(turn, RewardConfig(), thinking=False)
    assert parts["correctness"] == 0.0 and parts["speed"] == 0.0
    assert parts["format"] == pytest.approx(0.1) and parts["compile"] == pytest.approx(0.1)
    assert score == pytest.approx(0.2)


@pytest.mark.parametrize("speedup, meaningful", [(None, True), (2.0, False), (float("nan"), True), (0.0, True)])
def test_speed_needs_a_meaningful_measurement(speedup, meaningful):
    _, parts = score_turn(make_turn(speedup=speedup, meaningful=meaningful), RewardConfig(), thinking=False)
    assert parts["speed"] == 0.0
    assert parts["correctness"] == pytest.approx(1.0)


@pytest.mark.parametrize("tokens, expected", [(50, 0.0), (100, 0.0), (150, -0.5), (200, -1.0), (900, -1.0)])
def test_length_tie_breaker(tokens, expected):
    cfg = weights_only(length_weight=0.1, length_target_tokens=100)
    _, parts = score_turn(make_turn(response_tokens=tokens), cfg, thinking=False)
    assert parts["length"] == pytest.approx(0.1 * expected)


def test_thinking_bonus_only_when_enabled_and_given():
    cfg = weights_only(thinking_weight=0.25)
    assert score_turn(make_turn(thinking="plan: tile by 128"), cfg, thinking=True)[1]["thinking"] == pytest.approx(0.25)
    assert score_turn(make_turn(thinking="plan: tile by 128"), cfg, thinking=False)[1]["thinking"] == 0.0
    assert score_turn(make_turn(thinking="  \n "), cfg, thinking=True)[1]["thinking"] == 0.0
    assert score_turn(make_turn(thinking=None), cfg, thinking=True)[1]["thinking"] == 0.0


def test_turn_without_verdict_or_candidate():
    turn = make_turn(status=None)
    turn.candidate = None
    score, parts = score_turn(turn, RewardConfig(), thinking=True)
    assert score == 0.0 and all(v == 0.0 for v in parts.values())
