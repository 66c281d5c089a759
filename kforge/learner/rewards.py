"""Turn scores: the weighted reward components of one evaluated turn.

Every component is computed raw (a number on its own scale), multiplied by its weight from
``RewardConfig`` and returned separately, so the run log shows which part of the reward moved.
The turn score is the sum of the weighted components.

Raw components:

- ``format``: 1 when the response held a parsable kernel block (``candidate.code is not None``).
- ``compile``: 1 when the candidate got past building/importing (``verdict.status.compiled``).
- ``correctness``: partial credit, trials passed / trials (1 for a correct verdict). A flagged kernel
  (any reward-hacking finding) gets 0.
- ``speed``: only for a correct, unflagged kernel whose speedup was measured meaningfully (timed,
  finite, positive, not under the Triton interpreter). Forms, all bounded:
    * ``capped``: ``speedup - 1`` clipped to ``[SPEED_FLOOR, speed_cap]``. Slow kernels earn a
      penalty, but at most ``-SPEED_FLOOR`` = 0.5, so with equal correctness and speed weights a
      correct kernel never scores below half of the correctness weight.
    * ``log``: ``log(speedup)`` over the same speedup window, ``[log(1 + SPEED_FLOOR), log(1 + speed_cap)]``.
    * ``kevin``: the speedup itself, clipped to ``(0, 1 + speed_cap]``. With the kevin preset
      (correctness_weight 0.3, speed_weight 1.0) a correct kernel scores ``0.3 + speedup``, which is
      Kevin-32B's ``0.3 * correct + speedup``.
- ``length``: a tie-breaker, 0 up to ``length_target_tokens`` response tokens, then falling linearly to
  -1 at twice the target and staying there (bounded).
- ``thinking``: 1 when ``episode.thinking`` is on and the response had a non-empty ``<think>`` block.
"""

from __future__ import annotations

import math

from kforge.config.schema import RewardConfig
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.records import Turn

COMPONENTS = ("format", "compile", "correctness", "speed", "length", "thinking")

# Lowest value of speedup - 1 that the capped form pays out (a kernel at half the baseline's speed or slower).
SPEED_FLOOR = -0.5


def meaningful_speedup(verdict: Verdict | None) -> float | None:
    """The verdict's speedup when it may be rewarded, else None."""
    if verdict is None or not verdict.correct or not verdict.timing_meaningful:
        return None
    speedup = verdict.speedup
    if speedup is None or not math.isfinite(speedup) or speedup <= 0.0:
        return None
    return float(speedup)


def speed_value(speedup: float, form: str, cap: float) -> float:
    """The raw speed component of a rewarded speedup (see the module docstring)."""
    if form == "capped":
        return min(max(speedup - 1.0, SPEED_FLOOR), cap)
    if form == "log":
        return math.log(min(max(speedup, 1.0 + SPEED_FLOOR), 1.0 + cap))
    if form == "kevin":
        return min(speedup, 1.0 + cap)
    raise ValueError(f"reward.speed_form {form!r} is unknown; use capped, log or kevin")


def length_value(response_tokens: int, target: int) -> float:
    """0 up to the target length, then linearly down to -1 at twice the target."""
    over = (response_tokens - target) / target
    return -min(max(over, 0.0), 1.0)


def raw_components(turn: Turn, reward_cfg: RewardConfig, thinking: bool) -> dict[str, float]:
    """Every component on its own scale, before the weights."""
    candidate, verdict = turn.candidate, turn.verdict
    has_code = candidate is not None and candidate.code is not None
    flagged = verdict is not None and bool(verdict.flags)

    correctness = 0.0
    if verdict is not None and not flagged:
        correctness = 1.0 if verdict.status is Status.CORRECT else verdict.partial_credit

    speed = 0.0
    speedup = meaningful_speedup(verdict)
    if speedup is not None:
        speed = speed_value(speedup, reward_cfg.speed_form, reward_cfg.speed_cap)

    thought = thinking and candidate is not None and bool((candidate.thinking or "").strip())
    return {
        "format": 1.0 if has_code else 0.0,
        "compile": 1.0 if verdict is not None and verdict.status.compiled else 0.0,
        "correctness": correctness,
        "speed": speed,
        "length": length_value(len(turn.response_ids), reward_cfg.length_target_tokens),
        "thinking": 1.0 if thought else 0.0,
    }


def score_turn(turn: Turn, reward_cfg: RewardConfig, thinking: bool) -> tuple[float, dict[str, float]]:
    """The turn score s_t and its weighted components (which sum to it)."""
    raw = raw_components(turn, reward_cfg, thinking)
    weights = {
        "format": reward_cfg.format_weight,
        "compile": reward_cfg.compile_weight,
        "correctness": reward_cfg.correctness_weight,
        "speed": reward_cfg.speed_weight,
        "length": reward_cfg.length_weight,
        "thinking": reward_cfg.thinking_weight,
    }
    weighted = {name: weights[name] * raw[name] for name in COMPONENTS}
    return sum(weighted.values()), weighted
