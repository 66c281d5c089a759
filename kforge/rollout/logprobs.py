"""The sampling distribution, written once so the rollout backends and the learner agree on log-probs.

`process_logits` turns raw logits into the scores a token is sampled from: divide by the temperature
(temperature <= 0 means greedy and counts as 1), keep the top-k, keep the top-p nucleus (renormalised by
the softmax that follows). This is the order vLLM's sampler uses, and what its
`logprobs_mode="processed_logprobs"` reports. The learner must call `sampled_logprobs` with the rollout's
sampling settings to get log-probs comparable with the engine's (importance-sampling ratios).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def process_logits(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """float32 scores `(..., vocab)` with truncated entries at -inf."""
    import torch

    scores = logits.float()
    if temperature > 0.0 and temperature != 1.0:
        scores = scores / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= (1.0 - top_p)
        drop_sorted[..., -1] = False  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def sampled_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float, top_k: int = -1,
                     top_p: float = 1.0) -> torch.Tensor:
    """log p(token) under the processed distribution; `logits` `(..., vocab)`, `token_ids` `(...)`."""
    scores = process_logits(logits, temperature, top_k, top_p)
    logp = scores.log_softmax(dim=-1)
    return logp.gather(-1, token_ids.unsqueeze(-1).long()).squeeze(-1)
