"""The reward's tables and its order guarantee, from the weights alone: any correct kernel outranks any
incorrect one.

Two tables, each the one place its names live: the speed forms (``reward.speed_form``: the raw value of a
speedup and the range it can take) and the reward components (the ``RewardConfig`` field that weighs each,
and the raw range a correct and an incorrect kernel can earn). Pure arithmetic on ``RewardConfig``, here so
that the config is refused when it is resolved (a schema validator), before a model is loaded;
``kforge.credit.rewards`` scores turns with the same tables. ``tests/house/test_choice_tables.py`` checks them against
the schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

# Lowest value of speedup - 1 that the capped speed form pays out (a kernel at half the baseline's speed or slower).
SPEED_FLOOR = -0.5


@dataclass(frozen=True)
class SpeedForm:
    value: Callable[[float, float, float], float]  # (speedup, speed_cap, speed_threshold) -> raw speed value
    bounds: Callable[[float], tuple[float, float]]  # speed_cap -> lowest and highest raw value


SPEED_FORMS: dict[str, SpeedForm] = {
    "capped": SpeedForm(lambda s, cap, _: min(max(s - 1.0, SPEED_FLOOR), cap),
                        lambda cap: (SPEED_FLOOR, cap)),
    "log": SpeedForm(lambda s, cap, _: math.log(min(max(s, 1.0 + SPEED_FLOOR), 1.0 + cap)),
                     lambda cap: (math.log(1.0 + SPEED_FLOOR), math.log(1.0 + cap))),
    "kevin": SpeedForm(lambda s, cap, _: min(s, 1.0 + cap),
                       lambda cap: (0.0, 1.0 + cap)),
    "threshold": SpeedForm(lambda s, _, threshold: 1.0 if s >= threshold else 0.0,
                           lambda cap: (0.0, 1.0)),
}


def speed_range(form: str, cap: float) -> tuple[float, float]:
    """Lowest and highest raw speed value of a form (0 included: an unmeasured speedup earns 0)."""
    lo, hi = SPEED_FORMS[form].bounds(cap)
    return min(lo, 0.0), max(hi, 0.0)


class RewardFields(Protocol):
    """What this module reads of a RewardConfig, beside the weights it reads by name (the schema imports this
    module, so the config's class is named by its fields)."""

    speed_form: str
    speed_cap: float
    partial_credit: float


Range = Callable[[RewardFields, bool], tuple[float, float]]  # (RewardConfig, thinking) -> lowest and highest raw value


@dataclass(frozen=True)
class Component:
    weight: str  # the RewardConfig field that weighs it
    correct: Range  # what a correct kernel earns
    incorrect: Range  # what an incorrect, unflagged one earns


def _fixed(lo: float, hi: float) -> Range:
    return lambda cfg, thinking: (lo, hi)


def _thought(cfg: RewardFields, thinking: bool) -> tuple[float, float]:
    return (0.0, 1.0) if thinking else (0.0, 0.0)


# In scoring order (kforge.credit.rewards documents each). A flagged kernel earns the penalty alone.
REWARD_COMPONENTS: dict[str, Component] = {
    "format": Component("format_weight", _fixed(1.0, 1.0), _fixed(0.0, 1.0)),
    "compile": Component("compile_weight", _fixed(1.0, 1.0), _fixed(0.0, 1.0)),
    "correctness": Component("correctness_weight", _fixed(1.0, 1.0), lambda cfg, _: (0.0, cfg.partial_credit)),
    "speed": Component("speed_weight", lambda cfg, _: speed_range(cfg.speed_form, cfg.speed_cap), _fixed(0.0, 0.0)),
    "length": Component("length_weight", _fixed(-1.0, 0.0), _fixed(-1.0, 0.0)),
    "thinking": Component("thinking_weight", _thought, _thought),
    "penalty": Component("flagged_penalty", _fixed(0.0, 0.0), _fixed(0.0, 0.0)),
}


def weights(cfg: RewardFields) -> dict[str, float]:
    """Each component's weight in this RewardConfig."""
    return {name: float(getattr(cfg, c.weight)) for name, c in REWARD_COMPONENTS.items()}


def _span(weight: float, lo: float, hi: float) -> tuple[float, float]:
    return min(weight * lo, weight * hi), max(weight * lo, weight * hi)


def order_margin(cfg: RewardFields, thinking: bool) -> float:
    """Worst score a correct kernel can get minus the best an incorrect or flagged one can get.

    Correct: format, compile and correctness are 1; speed anywhere in its form's range (0 when not timed);
    length in [-1, 0]; thinking 0 or 1. Incorrect, unflagged: format and compile 0 or 1, correctness below
    ``partial_credit``, no speed. Flagged: ``flagged_penalty``. Positive means correct always ranks first.
    The order holds per turn score, not per discounted return: a multi-turn return adds later turns' scores.
    """
    worst_correct = best_incorrect = 0.0
    weight = weights(cfg)
    for name, c in REWARD_COMPONENTS.items():
        worst_correct += _span(weight[name], *c.correct(cfg, thinking))[0]
        best_incorrect += _span(weight[name], *c.incorrect(cfg, thinking))[1]
    return worst_correct - max(best_incorrect, weight["penalty"])


def order_problem(cfg: RewardFields, thinking: bool) -> str | None:
    """One line saying what is wrong when the weights break the order, else None."""
    margin = order_margin(cfg, thinking)
    if margin > 0.0:
        return None
    return (
        f"reward weights let an incorrect kernel score as high as a correct one (margin {margin:.3f}); "
        "raise reward.correctness_weight or lower reward.partial_credit, reward.speed_weight "
        "(slow-kernel penalty), reward.length_weight or reward.thinking_weight"
    )
