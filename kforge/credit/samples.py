"""The Sample record: one turn of one trajectory, ready for the learner."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One training sample. The loss covers only ``response_ids``; ``prompt_ids`` are context."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    rollout_logprobs: list[float] = field(default_factory=list)  # engine log-probs of response_ids; [] = none
    policy_version: int = 0  # adapter version that sampled it
    problem_key: str = ""
    turn_index: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)
