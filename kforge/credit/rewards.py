"""Turn scores: the weighted reward components of one evaluated turn.

Every component is computed raw (a number on its own scale), multiplied by its weight from
``RewardConfig`` and returned separately, so the run log shows which part of the reward moved.
The turn score is the sum of the weighted components.

Raw components:

- ``format``: 1 when the response held a parsable kernel block (``candidate.code is not None``).
- ``compile``: 1 when the candidate got past building/importing (``verdict.status.compiled``).
- ``correctness``: 1 for a correct verdict; an incorrect one earns ``partial_credit`` x trials passed /
  trials, so that partial credit stays a hint and never reaches a correct kernel (see ``order_margin``).
- ``speed``: only for a correct, unflagged kernel whose speedup was measured meaningfully (timed,
  finite, positive, not under the Triton interpreter). Forms, all bounded:
    * ``capped``: ``speedup - 1`` clipped to ``[SPEED_FLOOR, speed_cap]``. Slow kernels earn a
      penalty, but at most ``-SPEED_FLOOR`` = 0.5.
    * ``log``: ``log(speedup)`` over the same speedup window, ``[log(1 + SPEED_FLOOR), log(1 + speed_cap)]``.
    * ``kevin``: the speedup itself, clipped to ``(0, 1 + speed_cap]``. With the kevin preset
      (correctness_weight 0.3, speed_weight 1.0) a correct kernel scores ``0.3 + speedup``, which is
      Kevin-32B's ``0.3 * correct + speedup``.
    * ``threshold``: 1 when the speedup reaches ``speed_threshold`` (Fast@p with p = the threshold), else 0.
  With ``coverage_scaled_speed`` a positive speed reward is multiplied by ``verdict.coverage`` (the share
  of GPU time spent in the candidate's own kernels), so moving a trivial op into Triton while the heavy op
  stays in PyTorch earns little. A penalty (negative speed) is never scaled down: low coverage must not
  soften it. Coverage ``None`` means not measured (the CPU evaluator, or a GPU run whose profile could not
  be attributed): the speed reward is then left unscaled. On the CPU timing is never meaningful, so the
  speed reward is 0 there anyway.
- ``length``: a tie-breaker, 0 up to ``length_target_tokens`` response tokens, then falling linearly to
  -1 at twice the target and staying there (bounded).
- ``thinking``: 1 when ``episode.thinking`` is on and the response had a non-empty ``<think>`` block.
- ``penalty``: a flagged kernel (any reward-hacking finding) scores ``flagged_penalty`` and nothing
  else: no format, compile or length reward either (Dr. Kernel gives decoy kernels -1).

Ordering guarantee: any correct kernel outranks any incorrect or flagged one. ``order_margin`` computes the
worst correct score minus the best incorrect score from the weights alone, and ``score_turn`` refuses a
reward config whose margin is not positive.
"""

from __future__ import annotations

import math

from kforge.config.schema import RewardConfig
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.records import Trajectory, Turn

COMPONENTS = ("format", "compile", "correctness", "speed", "length", "thinking", "penalty")

# Lowest value of speedup - 1 that the capped form pays out (a kernel at half the baseline's speed or slower).
SPEED_FLOOR = -0.5


class RewardOrderError(ValueError):
    """The reward weights would let an incorrect kernel outrank a correct one; one line for the user."""


def meaningful_speedup(verdict: Verdict | None) -> float | None:
    """The verdict's speedup when it may be rewarded, else None."""
    if verdict is None or not verdict.correct or not verdict.timing_meaningful:
        return None
    speedup = verdict.speedup
    if speedup is None or not math.isfinite(speedup) or speedup <= 0.0:
        return None
    return float(speedup)


def speed_value(speedup: float, form: str, cap: float, threshold: float = 1.2) -> float:
    """The raw speed component of a rewarded speedup (see the module docstring)."""
    if form == "capped":
        return min(max(speedup - 1.0, SPEED_FLOOR), cap)
    if form == "log":
        return math.log(min(max(speedup, 1.0 + SPEED_FLOOR), 1.0 + cap))
    if form == "kevin":
        return min(speedup, 1.0 + cap)
    if form == "threshold":
        return 1.0 if speedup >= threshold else 0.0
    raise ValueError(f"reward.speed_form {form!r} is unknown; use capped, log, kevin or threshold")


def speed_range(form: str, cap: float) -> tuple[float, float]:
    """Lowest and highest raw speed value of a form (0 included: an unmeasured speedup earns 0)."""
    lo, hi = {
        "capped": (SPEED_FLOOR, cap),
        "log": (math.log(1.0 + SPEED_FLOOR), math.log(1.0 + cap)),
        "kevin": (0.0, 1.0 + cap),
        "threshold": (0.0, 1.0),
    }[form]
    return min(lo, 0.0), max(hi, 0.0)


def coverage_factor(verdict: Verdict | None) -> float:
    """verdict.coverage clipped to [0, 1]; 1 when it was not measured (None) or is not a number."""
    coverage = verdict.coverage if verdict is not None else None
    if coverage is None or not math.isfinite(coverage):
        return 1.0
    return min(max(float(coverage), 0.0), 1.0)


def length_value(response_tokens: int, target: int) -> float:
    """0 up to the target length, then linearly down to -1 at twice the target."""
    over = (response_tokens - target) / target
    return -min(max(over, 0.0), 1.0)


def _span(weight: float, lo: float, hi: float) -> tuple[float, float]:
    return min(weight * lo, weight * hi), max(weight * lo, weight * hi)


def order_margin(cfg: RewardConfig, thinking: bool) -> float:
    """Worst score a correct kernel can get minus the best an incorrect or flagged one can get.

    Correct: format, compile and correctness are 1; speed anywhere in its form's range (0 when not timed);
    length in [-1, 0]; thinking 0 or 1. Incorrect, unflagged: format and compile 0 or 1, correctness below
    ``partial_credit``, no speed. Flagged: ``flagged_penalty``. Positive means correct always ranks first.
    """
    smin, smax = speed_range(cfg.speed_form, cfg.speed_cap)
    think = (0.0, 1.0) if thinking else (0.0, 0.0)
    worst_correct = (
        cfg.format_weight + cfg.compile_weight + cfg.correctness_weight
        + _span(cfg.speed_weight, smin, smax)[0]
        + _span(cfg.length_weight, -1.0, 0.0)[0]
        + _span(cfg.thinking_weight, *think)[0]
    )
    best_incorrect = (
        _span(cfg.format_weight, 0.0, 1.0)[1]
        + _span(cfg.compile_weight, 0.0, 1.0)[1]
        + _span(cfg.correctness_weight, 0.0, cfg.partial_credit)[1]
        + _span(cfg.length_weight, -1.0, 0.0)[1]
        + _span(cfg.thinking_weight, *think)[1]
    )
    return worst_correct - max(best_incorrect, cfg.flagged_penalty)


def check_order(cfg: RewardConfig, thinking: bool) -> None:
    margin = order_margin(cfg, thinking)
    if margin <= 0.0:
        raise RewardOrderError(
            f"reward weights let an incorrect kernel score as high as a correct one (margin {margin:.3f}); "
            "raise reward.correctness_weight or lower reward.partial_credit, reward.speed_weight "
            "(slow-kernel penalty), reward.length_weight or reward.thinking_weight"
        )


def raw_components(turn: Turn, reward_cfg: RewardConfig, thinking: bool) -> dict[str, float]:
    """Every component on its own scale, before the weights (a flagged kernel: all 0, penalty 1)."""
    candidate, verdict = turn.candidate, turn.verdict
    if verdict is not None and verdict.flags:
        return {**dict.fromkeys(COMPONENTS, 0.0), "penalty": 1.0}
    has_code = candidate is not None and candidate.code is not None

    correctness = 0.0
    if verdict is not None:
        correctness = 1.0 if verdict.status is Status.CORRECT else reward_cfg.partial_credit * verdict.partial_credit

    speed = 0.0
    speedup = meaningful_speedup(verdict)
    if speedup is not None:
        speed = speed_value(speedup, reward_cfg.speed_form, reward_cfg.speed_cap, reward_cfg.speed_threshold)
        if reward_cfg.coverage_scaled_speed and speed > 0.0:
            speed *= coverage_factor(verdict)

    thought = thinking and candidate is not None and bool((candidate.thinking or "").strip())
    return {
        "format": 1.0 if has_code else 0.0,
        "compile": 1.0 if verdict is not None and verdict.status.compiled else 0.0,
        "correctness": correctness,
        "speed": speed,
        "length": length_value(len(turn.response_ids), reward_cfg.length_target_tokens),
        "thinking": 1.0 if thought else 0.0,
        "penalty": 0.0,
    }


def score_turn(turn: Turn, reward_cfg: RewardConfig, thinking: bool) -> tuple[float, dict[str, float]]:
    """The turn score s_t and its weighted components (which sum to it)."""
    check_order(reward_cfg, thinking)  # a handful of float operations: cheaper than caching by config
    raw = raw_components(turn, reward_cfg, thinking)
    weights = {
        "format": reward_cfg.format_weight,
        "compile": reward_cfg.compile_weight,
        "correctness": reward_cfg.correctness_weight,
        "speed": reward_cfg.speed_weight,
        "length": reward_cfg.length_weight,
        "thinking": reward_cfg.thinking_weight,
        "penalty": reward_cfg.flagged_penalty,
    }
    weighted = {name: weights[name] * raw[name] for name in COMPONENTS}
    return sum(weighted.values()), weighted


def score_trajectories(trajectories: list[Trajectory], reward_cfg: RewardConfig, thinking: bool) -> None:
    """Write every turn's score and its components from its verdict: the one writer of `Turn.score` (the
    episode only records verdicts)."""
    for trajectory in trajectories:
        for turn in trajectory.turns:
            turn.score, turn.reward_components = score_turn(turn, reward_cfg, thinking)
