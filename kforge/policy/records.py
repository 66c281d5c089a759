"""Records of the policy side: a parsed Candidate, one Turn of an episode, a Trajectory of turns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kforge.evaluator.verdict import Verdict


@dataclass
class Candidate:
    """Kernel source parsed out of one response, ready for the evaluator."""

    problem_key: str
    code: str | None  # None when the response had no parsable kernel block
    backend: str = "triton"
    thinking: str | None = None
    parse_error: str | None = None  # what was wrong with the response when code is None


@dataclass
class Turn:
    """One generation + evaluation inside an episode; every turn is one training sample."""

    index: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    logprobs: list[float]  # rollout engine's log-probs of response_ids (for IS correction)
    policy_version: int  # adapter version that sampled it (staleness)
    candidate: Candidate | None = None
    verdict: Verdict | None = None
    score: float = 0.0  # s_t from the reward weights
    reward_components: dict[str, float] = field(default_factory=dict)
    return_: float = 0.0  # R_t = s_t + gamma * s_{t+1} + ...
    advantage: float = 0.0
    prompt_tokens: int = 0
    dropped_attempts: int = 0  # earlier attempts cut by the context budget
    truncated: bool = False  # the response hit its max_tokens (finish_reason "length")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.verdict is not None:
            out["verdict"] = self.verdict.to_dict()
        return out


@dataclass
class Trajectory:
    """G of these per problem form a GRPO group."""

    problem_key: str
    group_index: int
    turns: list[Turn] = field(default_factory=list)
    stop_reason: str = ""  # correct | speedup_reached | max_turns | ...

    @property
    def best_verdict(self) -> Verdict | None:
        verdicts = [t.verdict for t in self.turns if t.verdict is not None]
        correct = [v for v in verdicts if v.correct]
        if correct:
            return max(correct, key=lambda v: v.speedup or 0.0)
        return verdicts[-1] if verdicts else None
