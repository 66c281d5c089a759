"""Every reward component, with numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from kforge.config.loader import preset_names, resolve
from kforge.config.schema import RewardConfig
from kforge.credit.rewards import COMPONENTS, SPEED_FLOOR, RewardOrderError, order_margin, score_turn
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.records import Candidate, Turn

# A module with the whole structure the format reward asks for: ModelNew.forward launches a kernel of the file.
KERNEL_MODULE = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return self.launch(a, b)

    def launch(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
"""


def make_turn(
    status: Status | None = Status.CORRECT,
    code: str | None = KERNEL_MODULE,
    trials_passed: int = 5,
    trials: int = 5,
    speedup: float | None = None,
    flags: list[str] | None = None,
    meaningful: bool = True,
    thinking: str | None = None,
    response_tokens: int = 10,
    coverage: float | None = None,
) -> Turn:
    verdict = None
    if status is not None:
        verdict = Verdict(
            status=status, trials_passed=trials_passed, trials=trials, speedup=speedup,
            flags=list(flags or []), timing_meaningful=meaningful, coverage=coverage,
        )
    return Turn(
        index=0, prompt_ids=[1, 2], response_ids=list(range(response_tokens)), response_text="",
        logprobs=[0.0] * response_tokens, policy_version=0,
        candidate=Candidate(problem_key="1/1", code=code, thinking=thinking), verdict=verdict,
    )


def weights_only(**kw: float) -> RewardConfig:
    """Only the given weights, plus correctness 1 (without it no correct kernel could outrank others)."""
    base = dict(format_weight=0.0, compile_weight=0.0, correctness_weight=1.0, speed_weight=0.0,
                length_weight=0.0, thinking_weight=0.0)
    base.update(kw)
    return RewardConfig(**base)


def test_components_are_all_returned_and_sum_to_the_score():
    score, parts = score_turn(make_turn(speedup=2.0), RewardConfig(), thinking=False)
    assert set(parts) == set(COMPONENTS)
    assert score == pytest.approx(sum(parts.values()))
    # defaults: format 0.1 + compile 0.1 + correctness 1.0 + speed 1.0 * min(2 - 1, 3)
    assert parts == pytest.approx({"format": 0.1, "compile": 0.1, "correctness": 1.0, "speed": 1.0,
                                   "length": 0.0, "thinking": 0.0, "penalty": 0.0})
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
    assert parts["correctness"] == pytest.approx(2.0 * 0.25 * 3 / 5)  # default partial_credit 0.25
    assert parts["speed"] == 0.0  # speed is for correct kernels only
    assert score == pytest.approx(0.3)


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


def test_flagged_kernel_gets_only_the_penalty():
    turn = make_turn(speedup=3.0, flags=["calls_reference_op"])
    score, parts = score_turn(turn, RewardConfig(), thinking=False)
    assert parts["correctness"] == 0.0 and parts["speed"] == 0.0
    assert parts["format"] == 0.0 and parts["compile"] == 0.0  # no format/compile reward for a hack
    assert parts["penalty"] == pytest.approx(-1.0) and score == pytest.approx(-1.0)
    # the penalty is configurable; a static-check failure with flags is a hack too
    static = make_turn(status=Status.STATIC_CHECK_FAILED, trials_passed=0, trials=0, flags=["pytorch_op:relu"])
    assert score_turn(static, RewardConfig(flagged_penalty=-0.5), thinking=False)[0] == pytest.approx(-0.5)
    assert score_turn(static, RewardConfig(flagged_penalty=0.0), thinking=False)[0] == 0.0


def test_partial_credit_no_longer_outranks_a_slow_correct_kernel():
    """The old bug: capped form, 3/5 trials passed scored 0.1 + 0.1 + 0.6 = 0.8 against a correct 0.5x
    kernel at 0.1 + 0.1 + 1.0 - 0.5 = 0.7. Now the incorrect one scores 0.1 + 0.1 + 0.25 * 0.6 = 0.35."""
    cfg = RewardConfig()
    wrong, _ = score_turn(make_turn(status=Status.INCORRECT, trials_passed=3, trials=5), cfg, thinking=False)
    slow, _ = score_turn(make_turn(speedup=0.5), cfg, thinking=False)
    assert wrong == pytest.approx(0.35) and slow == pytest.approx(0.7)
    assert slow > wrong
    # margin = worst correct (0.1 + 0.1 + 1 - 0.5 = 0.7) - best incorrect (0.1 + 0.1 + 0.25 = 0.45)
    assert order_margin(cfg, thinking=False) == pytest.approx(0.25)


# About 1.5 s a preset: the fast loop ranks the tiny preset's rewards.
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "tiny" else (pytest.mark.slow,)) for n in preset_names()])
def test_every_preset_ranks_any_correct_kernel_above_any_incorrect_one(name):
    resolved = resolve(name).config
    cfg, thinking = resolved.reward, resolved.episode.thinking
    assert order_margin(cfg, thinking) > 0
    worst_correct = min(
        score_turn(make_turn(speedup=s, response_tokens=n, meaningful=m, coverage=c), cfg, thinking)[0]
        for s in (0.01, 0.5, 1.0, 1.19, 1.2, 50.0) for n in (10, 10**6) for m in (True, False) for c in (None, 0.0)
    )
    best_incorrect = max(
        score_turn(make_turn(status=st, trials_passed=p, trials=5, response_tokens=10, thinking="t"), cfg, thinking)[0]
        for st in (Status.INCORRECT, Status.RUNTIME_ERROR, Status.COMPILE_ERROR) for p in (0, 4)
    )
    flagged = score_turn(make_turn(speedup=5.0, flags=["returns_input"]), cfg, thinking)[0]
    assert worst_correct > best_incorrect and worst_correct > flagged


def test_weights_that_break_the_order_are_refused():
    # correctness 1, partial credit 0.9, capped speed penalty up to 0.5: 1 - 0.5 < 0.9
    cfg = weights_only(correctness_weight=1.0, speed_weight=1.0, partial_credit=0.9)
    assert order_margin(cfg, thinking=False) == pytest.approx(-0.4)
    with pytest.raises(RewardOrderError, match="partial_credit"):
        score_turn(make_turn(), cfg, thinking=False)


@pytest.mark.parametrize("speedup, expected", [(1.19, 0.0), (1.2, 1.0), (3.0, 1.0), (0.5, 0.0)])
def test_threshold_speed_is_fast_at_p(speedup, expected):
    cfg = weights_only(correctness_weight=1.0, speed_weight=1.0, speed_form="threshold", speed_threshold=1.2)
    assert score_turn(make_turn(speedup=speedup), cfg, thinking=False)[1]["speed"] == pytest.approx(expected)


@pytest.mark.parametrize(
    "speedup, coverage, expected",
    [
        (3.0, 0.25, 2.0 * 0.25),  # capped: speedup - 1 = 2, a quarter of the time in its own kernels
        (3.0, 1.0, 2.0),
        (3.0, None, 2.0),  # not measured (CPU, or no profile): unscaled
        (3.0, 1.7, 2.0),  # clipped to 1
        (0.6, 0.1, -0.4),  # a slowdown penalty is never softened by low coverage
    ],
)
def test_coverage_scales_positive_speed_reward(speedup, coverage, expected):
    cfg = weights_only(correctness_weight=1.0, speed_weight=1.0, coverage_scaled_speed=True)
    _, parts = score_turn(make_turn(speedup=speedup, coverage=coverage), cfg, thinking=False)
    assert parts["speed"] == pytest.approx(expected)
    plain = weights_only(correctness_weight=1.0, speed_weight=1.0)
    assert score_turn(make_turn(speedup=3.0, coverage=0.25), plain, thinking=False)[1]["speed"] == pytest.approx(2.0)


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


# ---------------------------------------------------------------------------------------------------
# Format is kernel structure, not tags


def test_constant_strings_and_the_prompt_skeleton_earn_no_format():
    """Before, any readable block earned the whole format reward: `<KERNEL>x</KERNEL>` and the compact
    prompt's own skeleton scored the CPU curve's maximum."""
    from kforge.kernel_backends import KERNEL_BACKENDS

    cfg = RewardConfig(format_weight=1.0, compile_weight=0.5)
    for code in ("x", KERNEL_BACKENDS["triton"].skeleton, "pass", "class ModelNew: ..."):
        score, parts = score_turn(make_turn(status=Status.STATIC_CHECK_FAILED, code=code, trials=0, trials_passed=0),
                                  cfg, thinking=False)
        assert parts["format"] == 0.0 and score == 0.0, code
    score, parts = score_turn(make_turn(status=Status.COMPILE_ERROR, trials=0, trials_passed=0), cfg, thinking=False)
    assert parts["format"] == 1.0 and parts["compile"] == 0.0


def test_structure_is_graded_by_what_the_static_check_verifies():
    from kforge.credit.structure import structure_score

    forward_only = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a\n"
    not_launched = KERNEL_MODULE.replace("return self.launch(a, b)", "return a + b")
    via_function = KERNEL_MODULE.replace("self.launch(a, b)", "launch(None, a, b)").replace(
        "    def launch(self, a, b):", "def launch(self, a, b):").replace("        out = torch", "    out = torch").replace(
        "        add_kernel", "    add_kernel").replace("        return out", "    return out")
    assert structure_score(forward_only) == pytest.approx(1 / 3)
    assert structure_score(not_launched) == pytest.approx(2 / 3)
    assert structure_score(KERNEL_MODULE) == 1.0  # through a ModelNew method
    assert structure_score(via_function) == 1.0  # through a module-level function
    assert structure_score("import os\n" + KERNEL_MODULE) == 0.0  # refused by the static check: never runs
    assert structure_score(KERNEL_MODULE.replace("@triton.jit", "@jit")) == pytest.approx(1 / 3)  # not Triton's
    assert structure_score(None) == 0.0


def test_compile_reward_needs_the_whole_structure():
    """A module that imports but never launches its kernel compiled nothing (before: compile reward 1)."""
    not_launched = KERNEL_MODULE.replace("return self.launch(a, b)", "return a")
    cfg = RewardConfig(format_weight=0.3, compile_weight=0.3, correctness_weight=1.0, partial_credit=0.0)
    _, parts = score_turn(make_turn(status=Status.INCORRECT, code=not_launched, trials_passed=0), cfg, thinking=False)
    assert parts["format"] == pytest.approx(0.2) and parts["compile"] == 0.0
    _, parts = score_turn(make_turn(status=Status.INCORRECT, trials_passed=0), cfg, thinking=False)
    assert parts["format"] == pytest.approx(0.3) and parts["compile"] == pytest.approx(0.3)


def test_a_correct_verdict_has_the_whole_structure_whatever_the_source_looks_like():
    """The evaluator saw the kernel run in forward: format and compile are full even when the source
    launches it by a path the structure check does not follow (here through a dict), so the order
    guarantee (worst correct score) still holds."""
    odd = KERNEL_MODULE.replace("add_kernel[(", "{'k': add_kernel}['k'][(")
    from kforge.credit.structure import structure_score

    assert structure_score(odd) == pytest.approx(2 / 3)
    _, parts = score_turn(make_turn(code=odd), RewardConfig(), thinking=False)
    assert parts["format"] == pytest.approx(0.1) and parts["compile"] == pytest.approx(0.1)


def test_a_bad_reward_config_is_refused_when_the_config_is_resolved():
    """Before, the order check ran in the first score_turn, after the model load and the first rollouts."""
    from typer.testing import CliRunner

    from kforge.cli.app import app
    from kforge.config.loader import ConfigError

    bad = ["reward.correctness_weight=0.1", "reward.partial_credit=0.9", "reward.speed_weight=1"]
    with pytest.raises(ConfigError, match=r"^invalid value for reward \(from command line\): reward weights let"):
        resolve("tiny", overrides=bad)
    res = CliRunner().invoke(app, ["config", "show", "--preset", "tiny", *bad])
    assert res.exit_code == 2
    assert "reward weights let an incorrect kernel" in res.output and "Traceback" not in res.output
    # thinking on adds the thinking bonus to the best incorrect score: refused only then
    thinking = ["reward.thinking_weight=0.85", "reward.format_weight=0", "reward.compile_weight=0"]
    resolve("tiny", overrides=thinking)
    with pytest.raises(ConfigError, match="reward weights"):
        resolve("tiny", overrides=[*thinking, "episode.thinking=true"])
