"""The policy losses (``learner.loss_fn``): one row each, the one place a loss's name and properties live.

Torch-free data, here beside the settings because two layers read it: the learner computes a row's
surrogate (``kforge.learner.losses``), the credit step takes its default advantage normalisation
(``kforge.credit.advantages``). ``tests/house/test_choice_tables.py`` checks that the schema's literal lists these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LossRule:
    surrogate: Literal["truncated_is", "likelihood", "clipped"]  # the per-token loss (see kforge.learner.losses):
    # REINFORCE weighted by the truncated ratio to the sampling policy | -A x log-prob | PPO's clipped surrogate
    # times the truncated importance weight
    normalize_std: bool  # advantages divided by the group's std when learner.normalize_std is None
    constant_reduction: bool  # reduced by a constant token budget (Dr.GRPO) whatever learner.loss_aggregation says


LOSSES: dict[str, LossRule] = {
    "importance_sampling": LossRule("truncated_is", normalize_std=False, constant_reduction=False),
    "ppo": LossRule("clipped", normalize_std=False, constant_reduction=False),
    "grpo": LossRule("clipped", normalize_std=True, constant_reduction=False),
    "dr_grpo": LossRule("clipped", normalize_std=False, constant_reduction=True),
    "nll": LossRule("likelihood", normalize_std=False, constant_reduction=False),
}
# The supervised step's loss (`kforge sft`): the mean negative log-likelihood when every advantage is 1.
SUPERVISED_LOSS = "nll"


def loss_rule(loss_fn: str) -> LossRule:
    if loss_fn not in LOSSES:
        raise ValueError(f"learner.loss_fn {loss_fn!r} is unknown; use one of {', '.join(LOSSES)}")
    return LOSSES[loss_fn]
