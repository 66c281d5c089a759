"""Micro-batches under a token budget, left-padded so every response ends at the last position.

Left padding puts all responses in the last ``R`` columns (R = the longest response of the
micro-batch), so the model only has to produce logits for those columns (``logits_to_keep``): the
logits of a long prompt, the largest tensor of a step, are never built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kforge.credit.samples import Sample


def plan_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Group sample indices so that rows x longest row <= budget (the padded cost). Samples are sorted
    by length first so that similar lengths share a micro-batch (little padding). A sample longer than
    the budget gets a micro-batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > budget:
            batches.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


@dataclass
class MicroBatch:
    input_ids: Tensor  # [B, L], left-padded
    attention_mask: Tensor  # [B, L]
    position_ids: Tensor  # [B, L], 0 at each row's first real token
    targets: Tensor  # [B, R] response tokens, right-aligned in the last R columns
    response_mask: Tensor  # [B, R] bool, True on response tokens
    rollout_logprobs: Tensor  # [B, R] engine log-probs (0 where missing)
    has_rollout: Tensor  # [B, 1] bool, the sample came with engine log-probs
    advantages: Tensor  # [B, 1]
    indices: list[int]  # positions of these samples in the list given to collate
    padded: bool = True  # False when every row has the same length (no attention mask needed)

    @property
    def response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum().item())


def collate(samples: list[Sample], indices: list[int], pad_id: int, device: torch.device) -> MicroBatch:
    rows = [samples[i] for i in indices]
    length = max(s.num_tokens for s in rows)
    width = max(len(s.response_ids) for s in rows)
    n = len(rows)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    targets = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    rollout = torch.zeros((n, width), dtype=torch.float32)
    has_rollout = torch.zeros((n, 1), dtype=torch.bool)
    for r, s in enumerate(rows):
        ids = s.prompt_ids + s.response_ids
        input_ids[r, length - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[r, length - len(ids):] = 1
        k = len(s.response_ids)
        targets[r, width - k:] = torch.tensor(s.response_ids, dtype=torch.long)
        mask[r, width - k:] = True
        if s.rollout_logprobs:
            if len(s.rollout_logprobs) != k:
                raise ValueError(
                    f"sample {s.problem_key} turn {s.turn_index}: {len(s.rollout_logprobs)} rollout log-probs "
                    f"for {k} response tokens; the rollout backend must return one per sampled token"
                )
            rollout[r, width - k:] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
            has_rollout[r] = True
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.tensor([[s.advantage] for s in rows], dtype=torch.float32)
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        targets=targets.to(device),
        response_mask=mask.to(device),
        rollout_logprobs=rollout.to(device),
        has_rollout=has_rollout.to(device),
        advantages=advantages.to(device),
        indices=list(indices),
        padded=bool((attention == 0).any()),
    )
