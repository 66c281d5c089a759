"""Turn scores: the weighted reward components of one evaluated turn.

Every component is computed raw (a number on its own scale), multiplied by its weight from
``RewardConfig`` and returned separately, so the run log shows which part of the reward moved.
The turn score is the sum of the weighted components.

Raw components:

- ``format``: the share of a kernel module's structure the candidate's code has, as the static check
  verifies it (``kforge.credit.structure``: a ModelNew with forward, a kernel of the file, forward
  launching it; 0, 1/3, 2/3 or 1). A readable block alone earns 0: ``<KERNEL>x</KERNEL>`` or the prompt's
  skeleton must not be worth anything. A correct verdict has the full structure by definition (the
  evaluator saw the candidate's kernel run in forward).
- ``compile``: 1 when the candidate got past building/importing (``verdict.status.compiled``) and has the
  full structure (a module that imports but never launches its kernel has not compiled a kernel).
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

Templates: an incorrect answer whose code also answered another problem of the step (a fixed module that
compiles everywhere, e.g. ``2 * x + 1`` on the first input) earns no shaping credit, only the length floor
(-1): otherwise format and compile credit would pay it on every problem, the cheapest lesson there is.

Ordering guarantee: any correct kernel outranks any incorrect or flagged one, turn by turn (not return by
return: a discounted return also holds later turns' scores). ``order_margin`` (kforge.config.reward_order)
computes the worst correct score minus the best incorrect score from the weights alone; the config is
refused when it is resolved if that margin is not positive, and ``score_turn`` checks again (a config
built or changed in code skips the resolver).
"""

from __future__ import annotations

import math

from kforge.config.reward_order import (  # noqa: F401 (re-exported)
    REWARD_COMPONENTS,
    SPEED_FLOOR,
    SPEED_FORMS,
    order_margin,
    order_problem,
    speed_range,
    weights,
)
from kforge.config.schema import RewardConfig
from kforge.credit.structure import structure_score
from kforge.credit.templates import repeated_answers, template_stats
from kforge.errors import UserError
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.records import Trajectory, Turn

COMPONENTS = tuple(REWARD_COMPONENTS)  # their table: kforge.config.reward_order

class RewardOrderError(UserError):
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
    if form not in SPEED_FORMS:
        raise ValueError(f"reward.speed_form {form!r} is unknown; use one of {', '.join(SPEED_FORMS)}")
    return SPEED_FORMS[form].value(speedup, cap, threshold)


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


def check_order(cfg: RewardConfig, thinking: bool) -> None:
    problem = order_problem(cfg, thinking)
    if problem is not None:
        raise RewardOrderError(problem)


def raw_components(turn: Turn, reward_cfg: RewardConfig, thinking: bool, template: bool = False) -> dict[str, float]:
    """Every component on its own scale, before the weights (a flagged kernel: all 0, penalty 1; an
    incorrect ``template``, an answer also given to another problem: no shaping credit, length at -1)."""
    candidate, verdict = turn.candidate, turn.verdict
    if verdict is not None and verdict.flags:
        return {**dict.fromkeys(COMPONENTS, 0.0), "penalty": 1.0}
    if template and not (verdict is not None and verdict.correct):
        return {**dict.fromkeys(COMPONENTS, 0.0), "length": -1.0}
    if verdict is not None and verdict.status is Status.CORRECT:
        structure = 1.0
    elif candidate is not None:
        structure = structure_score(candidate.code, candidate.backend)
    else:
        structure = 0.0

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
        "format": structure,
        "compile": 1.0 if verdict is not None and verdict.status.compiled and structure >= 1.0 else 0.0,
        "correctness": correctness,
        "speed": speed,
        "length": length_value(len(turn.response_ids), reward_cfg.length_target_tokens),
        "thinking": 1.0 if thought else 0.0,
        "penalty": 0.0,
    }


def score_turn(turn: Turn, reward_cfg: RewardConfig, thinking: bool,
               template: bool = False) -> tuple[float, dict[str, float]]:
    """The turn score s_t and its weighted components (which sum to it)."""
    check_order(reward_cfg, thinking)  # a handful of float operations: cheaper than caching by config
    raw = raw_components(turn, reward_cfg, thinking, template)
    weight = weights(reward_cfg)
    weighted = {name: weight[name] * raw[name] for name in COMPONENTS}
    return sum(weighted.values()), weighted


def score_trajectories(trajectories: list[Trajectory], reward_cfg: RewardConfig, thinking: bool) -> dict[str, float]:
    """Write every turn's score and its components from its verdict: the one writer of `Turn.score` (the
    episode only records verdicts). The trajectories are one step's: an incorrect answer that also
    answered another of its problems is a template (``kforge.credit.templates``). Returns the template
    statistics."""
    templates = repeated_answers(trajectories)
    for trajectory in trajectories:
        for turn in trajectory.turns:
            turn.score, turn.reward_components = score_turn(turn, reward_cfg, thinking, id(turn) in templates)
    return template_stats(trajectories, templates)
