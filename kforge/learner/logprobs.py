"""Log-probs (and entropy) of response tokens under the model, as the rollout sampler saw them.

Convention: the log-prob of token y at position t is log_softmax(process_logits(logits_t, T, top_k, top_p))[y]
with ``process_logits`` from ``kforge.rollout.logprobs``, the one function the hf sampler also uses (and the
order vLLM's sampler applies): temperature, then top-k, then top-p. With top_k = -1 and top_p = 1 that is
plainly log_softmax(logits / T). A token outside the learner's own top-k/top-p set has log-prob -inf;
it is floored at ``LOGP_FLOOR`` (no gradient there) so that differences of log-probs stay finite.

Memory: the logits of every response position ([tokens, vocab], 152k columns for Qwen) are the largest
tensor of a step and its fp32 log-softmax is twice that. ``response_logprobs`` with ``chunk`` > 0 runs the
LM head itself, on ``chunk`` positions at a time inside an activation checkpoint: forward keeps only the
hidden states and one chunk's logits at a time, and backward recomputes each chunk's logits from its
hidden states. Only architectures whose head is a plain linear map of the last hidden state
(``SPLIT_HEAD_TYPES``) take that path; any other (logit soft-capping, scaling) builds the full logits.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from kforge.learner.batching import MicroBatch
from kforge.rollout.logprobs import process_logits

# Tokens per chunk of the fp32 log-softmax: bounds its memory to chunk x vocab x 4 bytes.
CHUNK_TOKENS = 1024
# Model types whose causal-LM logits are exactly lm_head(last hidden state): no soft-capping, no scaling.
SPLIT_HEAD_TYPES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3"})
# exp(LOGP_FLOOR - anything sampled) is 0 in fp32; floored tokens get no gradient.
LOGP_FLOOR = -1.0e4


def _chunk_logp(logits: Tensor, targets: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    x = process_logits(logits, temperature, top_k, top_p)
    logp = x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - x.logsumexp(-1)
    return logp.clamp(min=LOGP_FLOOR)


def _chunk_entropy(logits: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    x = process_logits(logits, temperature, top_k, top_p)
    logp = x.log_softmax(-1)
    # Truncated tokens have p = 0 and log p = -inf; 0 * -inf would be NaN, their share is 0.
    return -(logp.exp() * logp.masked_fill(torch.isinf(logp), 0.0)).sum(-1)


def response_logits(model: torch.nn.Module, batch: MicroBatch) -> Tensor:
    """Logits at the positions that predict the response tokens: [n, R, vocab]."""
    n, width = batch.targets.shape
    inputs = batch.model_inputs()
    # Padded rows: the last R + 1 columns; a packed row: exactly the positions that predict a target.
    keep = batch.positions.reshape(-1) if batch.positions is not None else width + 1
    try:
        logits = model(**inputs, logits_to_keep=keep).logits
    except TypeError:  # an architecture without logits_to_keep: select after the fact
        return batch.pick(model(**inputs).logits).reshape(n, width, -1)
    if batch.positions is not None:
        return logits.reshape(n, width, -1)
    # Column j of the window predicts the token after it; the last column predicts past the end.
    return logits[:, -(width + 1):-1, :]


def _chunked(fn, logits: Tensor, extra: tuple, *args) -> Tensor:
    """fn over chunks of the flattened tokens; under autograd a low-precision chunk is recomputed in the
    backward pass rather than keeping an fp32 copy of the logits alive."""
    b, r, v = logits.shape
    flat = logits.reshape(b * r, v)
    parts = []
    for start in range(0, b * r, CHUNK_TOKENS):
        lg = flat[start:start + CHUNK_TOKENS]
        chunk_extra = tuple(e[start:start + CHUNK_TOKENS] for e in extra)
        if lg.requires_grad and lg.dtype != torch.float32:
            parts.append(checkpoint(fn, lg, *chunk_extra, *args, use_reentrant=False))
        else:
            parts.append(fn(lg, *chunk_extra, *args))
    return torch.cat(parts).reshape(b, r)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> Tensor:
    """Log-probs of the targets under the processed distribution (see the module docstring)."""
    return _chunked(_chunk_logp, logits, (targets.reshape(-1),), temperature, top_k, top_p)


def token_entropy(
    logits: Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0, grad: bool = False
) -> Tensor:
    """Entropy of the processed next-token distribution at each position; differentiable with ``grad``
    (the entropy bonus), else computed without autograd."""
    if grad:
        return _chunked(_chunk_entropy, logits, (), temperature, top_k, top_p)
    with torch.no_grad():
        return _chunked(_chunk_entropy, logits.detach(), (), temperature, top_k, top_p)


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, lm_head) of a causal LM (or a PEFT model around one) whose logits are a plain linear map
    of the decoder's output, else None. LoRA layers sit inside the decoder, so calling it applies them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in SPLIT_HEAD_TYPES or not hasattr(base, "get_decoder"):
        return None
    head = base.get_output_embeddings()
    return (base.get_decoder(), head) if head is not None else None


def _head_chunk(head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: float, top_k: int,
                top_p: float, entropy: bool, entropy_grad: bool) -> tuple[Tensor, Tensor]:
    x = process_logits(head(hidden), temperature, top_k, top_p)
    lse = x.logsumexp(-1, keepdim=True)
    logp = (x.gather(-1, targets.unsqueeze(-1)) - lse).squeeze(-1).clamp(min=LOGP_FLOOR)
    if not entropy:
        return logp, torch.zeros_like(logp.detach())
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        all_logp = x - lse
        ent = -(all_logp.exp() * all_logp.masked_fill(torch.isinf(all_logp), 0.0)).sum(-1)
    return logp, ent


def response_logprobs(
    model: torch.nn.Module,
    batch: MicroBatch,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    *,
    chunk: int = CHUNK_TOKENS,
    entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of the response tokens [B, R] and, with ``entropy``, the entropy of each position's
    processed distribution (differentiable with ``entropy_grad``). ``chunk`` positions of the LM head at
    a time (see the module docstring); 0, or a model whose head does not split off, builds full logits."""
    split = split_head(model) if chunk > 0 else None
    if split is None:
        logits = response_logits(model, batch)
        logp = token_logprobs(logits, batch.targets, temperature, top_k, top_p)
        ent = token_entropy(logits, temperature, top_k, top_p, grad=entropy_grad) if entropy else None
        return logp, ent
    decoder, head = split
    b, width = batch.targets.shape
    flat = batch.pick(decoder(**batch.model_inputs()).last_hidden_state)
    targets = batch.targets.reshape(-1)
    logps, ents = [], []
    # Recompute in backward only what backward needs: the same for every chunk.
    recompute = torch.is_grad_enabled() and (flat.requires_grad or any(p.requires_grad for p in head.parameters()))
    for start in range(0, b * width, chunk):
        args = (head, flat[start:start + chunk], targets[start:start + chunk], temperature, top_k, top_p,
                entropy, entropy_grad)
        if recompute:
            lp, ent = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _head_chunk(*args)
        logps.append(lp)
        ents.append(ent)
    logp = torch.cat(logps).reshape(b, width)
    return logp, (torch.cat(ents).reshape(b, width) if entropy else None)
