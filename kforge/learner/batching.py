"""Micro-batches under a token budget, left-padded so every response ends at the last position.

Left padding puts all responses in the last ``R`` columns (R = the longest response of the
micro-batch), so the model only has to produce logits for those columns (``logits_to_keep``): the
logits of a long prompt, the largest tensor of a step, are never built.

The per-sample fields (targets, masks, rollout log-probs, advantages) have one row per sample, the
response right-aligned in ``R`` columns, whatever the layout of the model's input: padded rows here,
or one packed row (``kforge.learner.packing``), where ``positions`` says which input position's hidden
state predicts each target.
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
    # Packed input only: [n, R] index into the flattened input of the hidden state that predicts each
    # target, and the variable-length attention arguments (kforge.learner.varlen).
    positions: Tensor | None = None
    segments: dict | None = None

    def model_inputs(self) -> dict:
        """Keyword arguments of the model's (or its decoder's) forward for this micro-batch."""
        return dict(
            input_ids=self.input_ids,
            # Without padding, no mask: attention can then take the plain causal (flash) path, or, for a
            # packed row, take each sample's span from ``segments`` (kforge_varlen) or from position_ids
            # restarting at 0 (transformers' own sdpa mask).
            attention_mask=self.attention_mask if self.padded else None,
            position_ids=self.position_ids,
            use_cache=False,
            **(self.segments or {}),
        )

    def pick(self, hidden: Tensor) -> Tensor:
        """The states [n * R, ...] at the positions that predict the response tokens, from [B, L, ...]."""
        n, width = self.targets.shape
        if self.positions is not None:
            return hidden.reshape(-1, *hidden.shape[2:])[self.positions.reshape(-1)]
        # Column j of the last R + 1 predicts the token after it; the last column predicts past the end.
        return hidden[:, -(width + 1):-1].reshape(n * width, *hidden.shape[2:])

    @property
    def response_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum().item())


def response_fields(rows: list[Sample], width: int, pad_id: int) -> dict[str, Tensor]:
    """targets, response_mask, rollout_logprobs, has_rollout, advantages: one row per sample, right-aligned."""
    n = len(rows)
    targets = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    rollout = torch.zeros((n, width), dtype=torch.float32)
    has_rollout = torch.zeros((n, 1), dtype=torch.bool)
    for r, s in enumerate(rows):
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
    advantages = torch.tensor([[s.advantage] for s in rows], dtype=torch.float32)
    return dict(targets=targets, response_mask=mask, rollout_logprobs=rollout, has_rollout=has_rollout,
                advantages=advantages)


def collate(samples: list[Sample], indices: list[int], pad_id: int, device: torch.device) -> MicroBatch:
    rows = [samples[i] for i in indices]
    length = max(s.num_tokens for s in rows)
    width = max(len(s.response_ids) for s in rows)
    n = len(rows)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, length), dtype=torch.long)
    for r, s in enumerate(rows):
        ids = s.prompt_ids + s.response_ids
        input_ids[r, length - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[r, length - len(ids):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    fields = {k: v.to(device) for k, v in response_fields(rows, width, pad_id).items()}
    return MicroBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        position_ids=positions.to(device),
        indices=list(indices),
        padded=bool((attention == 0).any()),
        **fields,
    )
