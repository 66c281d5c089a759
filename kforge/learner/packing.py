"""Packed micro-batches: several samples concatenated into one row, no padding (``learner.pack``).

A padded micro-batch of rows of different lengths spends the model's FLOPs on padding as well: every
row is as long as its longest, and ``plan_micro_batches`` budgets rows x longest row. A packed
micro-batch is one row holding whole samples one after another, up to ``micro_batch_tokens`` real
tokens (first-fit by decreasing length; a sample longer than the budget gets a row of its own).

Attention never crosses a sample boundary: position_ids restart at 0 at each sample, and there is no
attention mask. transformers (5.24, ``masking_utils.find_packed_sequence_indices``) then detects the
packed layout from the position_ids (a new sample wherever a position is not the previous one + 1) and
builds a causal mask that is also block-diagonal by sample, for sdpa and eager attention alike: a dense
[L, L] mask over the whole row. ``kforge.learner.varlen`` replaces sdpa's
dense mask with variable-length attention (torch's flash kernel on a GPU) from the ``segments``
(cumulative sample lengths) that ``collate_packed`` passes along to every attention layer.

The per-sample fields (targets, masks, advantages) keep the padded layout, one row per sample, so the
loss, the old log-probs and the metrics do not know which layout the model saw.
"""

from __future__ import annotations

import torch

from kforge.credit.samples import Sample
from kforge.learner.batching import MicroBatch, collate, plan_micro_batches, response_fields


def plan_packed(lengths: list[int], budget: int) -> list[list[int]]:
    """Group sample indices into rows of at most ``budget`` real tokens: first fit, longest first."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(budget - lengths[i])
    return rows


def collate_packed(samples: list[Sample], indices: list[int], pad_id: int, device: torch.device) -> MicroBatch:
    """One row [1, sum of lengths] of ``samples[indices]``; position_ids restart at 0 at each sample."""
    rows = [samples[i] for i in indices]
    width = max(len(s.response_ids) for s in rows)
    ids: list[int] = []
    pos: list[int] = []
    starts = [0]
    positions = torch.zeros((len(rows), width), dtype=torch.long)  # masked columns point at position 0
    for r, s in enumerate(rows):
        k, offset = len(s.response_ids), len(ids)
        ids += s.prompt_ids + s.response_ids
        pos += range(s.num_tokens)
        starts.append(len(ids))
        # The state at the last prompt token predicts the first response token, and so on.
        first = offset + len(s.prompt_ids) - 1
        positions[r, width - k:] = torch.arange(first, first + k)
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    longest = max(s.num_tokens for s in rows)
    fields = {k: v.to(device) for k, v in response_fields(rows, width, pad_id).items()}
    return MicroBatch(
        input_ids=torch.tensor([ids], dtype=torch.long, device=device),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=device),
        position_ids=torch.tensor([pos], dtype=torch.long, device=device),
        indices=list(indices),
        padded=False,
        positions=positions.to(device),
        # transformers' flash-attention argument names, passed down to every attention layer.
        segments=dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest),
        **fields,
    )


def plan(lengths: list[int], budget: int, pack: bool) -> list[list[int]]:
    """Micro-batches of sample indices under ``budget`` tokens: packed rows, or padded rows x length."""
    return plan_packed(lengths, budget) if pack else plan_micro_batches(lengths, budget)


def collate_any(samples: list[Sample], indices: list[int], pad_id: int, device: torch.device, pack: bool) -> MicroBatch:
    return collate_packed(samples, indices, pad_id, device) if pack else collate(samples, indices, pad_id, device)


def padding_share(lengths: list[int], budget: int, pack: bool) -> float:
    """Share of the model's input positions that are padding under a plan (0 for packed rows)."""
    real = sum(lengths)
    if pack or not real:
        return 0.0
    total = sum(len(b) * max(lengths[i] for i in b) for b in plan_micro_batches(lengths, budget))
    return 1.0 - real / total
