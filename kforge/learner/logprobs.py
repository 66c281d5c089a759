"""Log-probs (and entropy) of response tokens under the model, at a given sampling temperature.

Convention: the log-prob of token y at position t is log_softmax(logits_t / T)[y], with T the
learner's ``temperature`` (1.0 unless the caller sets it to match the rollout sampler).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from kforge.learner.batching import MicroBatch

# Tokens per chunk of the fp32 log-softmax: bounds its memory to chunk x vocab x 4 bytes.
CHUNK_TOKENS = 1024


def _chunk_logp(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - x.logsumexp(-1)


@torch.no_grad()
def _chunk_entropy(logits: Tensor, temperature: float) -> Tensor:
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    logz = x.logsumexp(-1, keepdim=True)
    p = torch.exp(x - logz)
    return (logz.squeeze(-1) - (p * x).sum(-1))


def response_logits(model: torch.nn.Module, batch: MicroBatch) -> Tensor:
    """Logits at the positions that predict the response tokens: [B, R, vocab]."""
    width = batch.targets.shape[1]
    kwargs = dict(
        input_ids=batch.input_ids,
        # Without padding, no mask: attention can then take the plain causal (flash) path.
        attention_mask=batch.attention_mask if batch.padded else None,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    try:
        logits = model(**kwargs, logits_to_keep=width + 1).logits
    except TypeError:  # an architecture without logits_to_keep: slice after the fact
        logits = model(**kwargs).logits
    # Column j of the window predicts the token after it; the last column predicts past the end.
    return logits[:, -(width + 1):-1, :]


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log_softmax(logits / T) at the targets, in chunks; under autograd each chunk is recomputed in
    the backward pass rather than keeping an fp32 copy of the logits alive."""
    b, r, v = logits.shape
    flat_logits = logits.reshape(b * r, v)
    flat_targets = targets.reshape(b * r)
    parts = []
    for start in range(0, b * r, CHUNK_TOKENS):
        lg = flat_logits[start:start + CHUNK_TOKENS]
        tg = flat_targets[start:start + CHUNK_TOKENS]
        if lg.requires_grad and lg.dtype != torch.float32:
            parts.append(checkpoint(_chunk_logp, lg, tg, temperature, use_reentrant=False))
        else:
            parts.append(_chunk_logp(lg, tg, temperature))
    return torch.cat(parts).reshape(b, r)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of the (tempered) next-token distribution at each position, no gradient."""
    b, r, v = logits.shape
    flat = logits.detach().reshape(b * r, v)
    parts = [_chunk_entropy(flat[s:s + CHUNK_TOKENS], temperature) for s in range(0, b * r, CHUNK_TOKENS)]
    return torch.cat(parts).reshape(b, r)
