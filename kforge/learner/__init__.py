"""Losses and the LoRA learner (rewards, returns and advantages live in ``kforge.credit``).

Names are imported lazily, so that ``kforge.learner.learner`` (torch, PEFT) can be imported without the
config stack and the light functions without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Learner": "kforge.learner.learner",
    "LearnerError": "kforge.learner.lora",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:  # noqa: ANN401 - a name imported lazily: its own type, whatever it is
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(name)
