"""Rewards, returns/advantages, losses and the LoRA learner.

Names are imported lazily, so that ``kforge.learner.learner`` (torch, PEFT) can be imported without the
config stack and the light functions without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Sample": "kforge.learner.samples",
    "assign_returns": "kforge.learner.advantages",
    "build_samples": "kforge.learner.advantages",
    "score_turn": "kforge.learner.rewards",
    "Learner": "kforge.learner.learner",
    "LearnerError": "kforge.learner.lora",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
