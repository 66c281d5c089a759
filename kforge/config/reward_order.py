"""The reward's order guarantee, from the weights alone: any correct kernel outranks any incorrect one.

Pure arithmetic on ``RewardConfig``, here so that the config is refused when it is resolved (a schema
validator), before a model is loaded; ``kforge.credit.rewards`` scores turns with the same numbers.
"""

from __future__ import annotations

import math
from typing import Any

# Lowest value of speedup - 1 that the capped speed form pays out (a kernel at half the baseline's speed or slower).
SPEED_FLOOR = -0.5


def speed_range(form: str, cap: float) -> tuple[float, float]:
    """Lowest and highest raw speed value of a form (0 included: an unmeasured speedup earns 0)."""
    lo, hi = {
        "capped": (SPEED_FLOOR, cap),
        "log": (math.log(1.0 + SPEED_FLOOR), math.log(1.0 + cap)),
        "kevin": (0.0, 1.0 + cap),
        "threshold": (0.0, 1.0),
    }[form]
    return min(lo, 0.0), max(hi, 0.0)


def _span(weight: float, lo: float, hi: float) -> tuple[float, float]:
    return min(weight * lo, weight * hi), max(weight * lo, weight * hi)


def order_margin(cfg: Any, thinking: bool) -> float:
    """Worst score a correct kernel can get minus the best an incorrect or flagged one can get.

    Correct: format, compile and correctness are 1; speed anywhere in its form's range (0 when not timed);
    length in [-1, 0]; thinking 0 or 1. Incorrect, unflagged: format and compile 0 or 1, correctness below
    ``partial_credit``, no speed. Flagged: ``flagged_penalty``. Positive means correct always ranks first.
    The order holds per turn score, not per discounted return: a multi-turn return adds later turns' scores.
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


def order_problem(cfg: Any, thinking: bool) -> str | None:
    """One line saying what is wrong when the weights break the order, else None."""
    margin = order_margin(cfg, thinking)
    if margin > 0.0:
        return None
    return (
        f"reward weights let an incorrect kernel score as high as a correct one (margin {margin:.3f}); "
        "raise reward.correctness_weight or lower reward.partial_credit, reward.speed_weight "
        "(slow-kernel penalty), reward.length_weight or reward.thinking_weight"
    )
