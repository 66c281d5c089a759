"""Policy-gradient losses on per-token log-probs, and how they are reduced to one number.

Notation (all per response token, shape [batch, tokens]):
  logp     log-prob under the policy being trained (carries the gradient)
  old      log-prob under the learner's weights when the batch arrived (detached); equals ``logp``
           on the first optimiser step of a batch, so ratios start at exactly 1
  rollout  log-prob that the rollout engine reported when it sampled the token
  A        advantage (per sequence, broadcast over its tokens, or per token after a KL adjustment)

Losses (``learner.loss_fn``; their table, with each one's surrogate, is ``kforge.config.losses``):
  importance_sampling  REINFORCE weighted by the ratio to the sampling policy, truncated:
                       value min(r, C) * A, gradient min(r, C) * A * grad(logp), r = exp(logp - rollout)
  nll                  -A * logp, no ratio: with every advantage 1 the mean negative log-likelihood of the
                       response tokens (``kforge sft``'s supervised step, on the same learner)
  ppo, grpo, dr_grpo   clipped surrogate min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with
                       r = exp(logp - old), times the truncated importance weight
                       w = min(exp(old - rollout), C) (detached), which corrects the mismatch between the
                       engine's numerics/staleness and the learner. grpo and ppo differ only in the default
                       advantage normalisation; dr_grpo also differs in the reduction (``constant``).

Mismatch rejection (``mismatch_rejected``): truncated IS bounds the weight of a token the engine and the
learner disagree on, but a sequence whose disagreement is extreme (a numerics bug, a stale or wrong
adapter) is better left out than down-weighted: its loss is masked, the normaliser is unchanged.

Non-finite values: a token outside the learner's top-k/top-p set has log-prob -inf, floored at -1e4
(kforge.learner.logprobs). Log ratios inside exp() are bounded (``MAX_LOG_RATIO``), masks are applied
with ``torch.where`` (inf * 0 would be NaN), and the clipped surrogate counts only where the truncated
weight is positive (0 * a huge ratio would be NaN), so one such token never skips the optimiser step.

Reductions: ``token_mean`` (sum over tokens / tokens), ``sequence_mean`` (mean over each sequence, then
over sequences) and ``constant`` (Dr.GRPO: sum over tokens / (sequences * a fixed token budget), so a
long response's tokens weigh the same as a short one's: no length bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kforge.config.losses import loss_rule


@dataclass
class TokenLoss:
    loss: Tensor  # per-token loss, [batch, tokens]
    ratio: Tensor  # the policy ratio the loss used (detached)
    is_weight: Tensor  # truncated importance weight (detached); the weight itself for importance_sampling
    is_clipped: Tensor  # bool: the importance ratio hit the cap C
    clipped: Tensor  # bool: the PPO clip was active (gradient cut) at this token


# Bound of a log-ratio inside exp(): exp(20) ~ 5e8 is finite in fp32 and far past any clip or cap, while a
# floored log-prob (-1e4, see kforge.learner.logprobs) against a real one would make exp() inf.
MAX_LOG_RATIO = 20.0


def bounded(log_ratio: Tensor) -> Tensor:
    """``log_ratio`` clamped to [-MAX_LOG_RATIO, MAX_LOG_RATIO] (no gradient where it is clamped)."""
    return log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def truncated_is_weight(old: Tensor, rollout: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """min(exp(old - rollout), cap), detached, and where the cap was hit."""
    ratio = torch.exp((old - rollout).detach())  # not bounded: a floored ``old`` must give exactly 0
    return ratio.clamp(max=cap), ratio > cap


def token_loss(
    loss_fn: str,
    logp: Tensor,
    old: Tensor,
    rollout: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    is_clip: float,
) -> TokenLoss:
    """The per-token loss of ``loss_fn`` (see the module docstring). ``advantages`` broadcasts to ``logp``:
    pass shape [batch, 1] for per-sequence advantages."""
    surrogate = loss_rule(loss_fn).surrogate
    if surrogate == "truncated_is":
        ratio = torch.exp((logp - rollout).detach())
        capped = ratio.clamp(max=is_clip)
        # value min(r, C); gradient min(r, C) * grad(logp). exp(logp - logp.detach()) is exactly 1 with
        # gradient grad(logp), so nothing divides by r (r * C / r was 0/0 = NaN when r underflowed).
        weighted = capped * torch.exp(logp - logp.detach())
        loss = -weighted * advantages
        false = torch.zeros_like(logp, dtype=torch.bool)
        return TokenLoss(loss, ratio, capped, ratio > is_clip, false)
    if surrogate == "likelihood":
        ones, false = torch.ones_like(logp), torch.zeros_like(logp, dtype=torch.bool)
        return TokenLoss(-logp * advantages, ones, ones, false, false)
    if surrogate == "clipped":
        weight, is_clipped = truncated_is_weight(old, rollout, is_clip)
        ratio = torch.exp(bounded(logp - old.detach()))
        unclipped = ratio * advantages
        clipped_term = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
        surrogate = torch.minimum(unclipped, clipped_term)
        adv = advantages.expand_as(ratio)
        active = ((ratio > 1.0 + clip_high) & (adv > 0)) | ((ratio < 1.0 - clip_low) & (adv < 0))
        # A token the learner had floored (outside its top-k/top-p set) has weight 0; 0 * a huge ratio
        # must be 0, not NaN, and must not reach the gradient either.
        loss = torch.where(weight > 0, -weight * surrogate, torch.zeros_like(surrogate))
        return TokenLoss(loss, ratio.detach(), weight, is_clipped, active.detach())
    raise ValueError(f"surrogate {surrogate!r} of learner.loss_fn {loss_fn!r} is not computed here")


def mismatch_rejected(
    old: Tensor, rollout: Tensor, mask: Tensor, has_rollout: Tensor, *, max_ratio: float | None, token_veto: float | None
) -> Tensor:
    """[batch] bool: sequences to drop because the learner (``old``) and the engine (``rollout``) disagree.

    A sequence is dropped when the geometric mean of its token ratios exp(old - rollout) is outside
    [1 / max_ratio, max_ratio], or when any of its tokens has a ratio below ``token_veto`` (the learner
    finds a sampled token far less likely than the engine claimed). Rows without engine log-probs
    (``has_rollout`` False, shape [batch, 1]) are never dropped."""
    diff = torch.where(mask.bool(), (old - rollout).detach(), torch.zeros_like(old))
    keep_rows = has_rollout.reshape(-1)
    rejected = torch.zeros_like(keep_rows)
    if max_ratio is not None:
        mean_log = diff.sum(-1) / mask.sum(-1).clamp(min=1)
        rejected |= mean_log.abs() > torch.log(torch.tensor(max_ratio, dtype=diff.dtype))
    if token_veto is not None:
        low = (diff < torch.log(torch.tensor(token_veto, dtype=diff.dtype))) & mask
        rejected |= low.any(-1)
    return rejected & keep_rows


def reduction_for(loss_fn: str, aggregation: str) -> str:
    """dr_grpo always reduces by the constant budget; the others follow learner.loss_aggregation."""
    return "constant" if loss_rule(loss_fn).constant_reduction else aggregation


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    total_tokens: float | None = None,
    total_seqs: float | None = None,
    const_len: float | None = None,
) -> Tensor:
    """Reduce [batch, tokens] to a scalar. The totals default to this batch's; pass the totals of the
    whole optimiser minibatch when this is one micro-batch of it, so that the micro-batch losses add up
    to the minibatch loss (gradient accumulation without bias)."""
    # where(), not a product: a non-finite value at a masked position (a pad, a rejected row) times 0 is NaN.
    summed = torch.where(mask.bool(), per_token, torch.zeros_like(per_token)).sum(dim=-1)  # per sequence
    mask = mask.to(per_token.dtype)
    seqs = float(total_seqs) if total_seqs is not None else float(per_token.shape[0])
    if mode == "token_mean":
        tokens = float(total_tokens) if total_tokens is not None else float(mask.sum().item())
        return summed.sum() / max(tokens, 1.0)
    if mode == "sequence_mean":
        lengths = mask.sum(dim=-1).clamp(min=1.0)
        return (summed / lengths).sum() / max(seqs, 1.0)
    if mode == "constant":
        if const_len is None or const_len <= 0:
            raise ValueError("the constant reduction needs a positive token budget (rollout.max_tokens)")
        return summed.sum() / (max(seqs, 1.0) * float(const_len))
    raise ValueError(f"loss aggregation {mode!r} is unknown; use token_mean, sequence_mean or constant")


def kl_estimate(logp: Tensor, ref: Tensor, estimator: str) -> Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy: the value, for the log.
    k1 = log(pi/ref) (unbiased, noisy, can be negative); k2 = (log(pi/ref))^2 / 2; k3 = ref/pi - log(ref/pi) - 1
    (>= 0, unbiased, low variance). The log ratio is bounded (``MAX_LOG_RATIO``): with top-k/top-p a sampled
    token can lie outside the policy's or the reference's truncated set (log-prob floored at -1e4), and
    exp(1e4) is inf."""
    log_ratio = bounded(ref.detach() - logp)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio * log_ratio
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"learner.kl_estimator {estimator!r} is unknown; use k2 or k3")


# What a KL estimator is worth as a loss: its expected gradient under the policy's own samples.
#   k1: E[grad log pi] = 0, so it regularises nothing (and with kl_discount it points against the KL).
#   k2: r_t grad log pi_t with r = log(pi/ref): the own-token part of the sequence KL's gradient; with the
#       later tokens' log ratios added to the advantage (kl_discount = 1) the sum is exact.
#   k3: (1 - ref/pi) grad log pi_t: close to k2 near the reference, biased further away.
KL_LOSSES = ("k2", "k3")


def kl_loss(logp: Tensor, ref: Tensor, estimator: str, weight: Tensor) -> Tensor:
    """Per-token KL penalty to add to the policy loss, weighted like the policy term by the (detached)
    importance weight ``weight``: the tokens were drawn by the rollout engine, not by the policy."""
    return _weighted(_loss_estimate(logp, ref, estimator), weight)


def _loss_estimate(logp: Tensor, ref: Tensor, estimator: str) -> Tensor:
    if estimator not in KL_LOSSES:
        raise ValueError(f"learner.kl_estimator {estimator!r} cannot be a loss: k1's expected gradient is 0 "
                         "(it regularises nothing); use k2 (exact with learner.kl_discount=1) or k3")
    return kl_estimate(logp, ref, estimator)


def _weighted(value: Tensor, weight: Tensor) -> Tensor:
    return torch.where(weight > 0, weight.detach() * value, torch.zeros_like(value))


def regularised_token_loss(
    loss_fn: str,
    logp: Tensor,
    old: Tensor,
    rollout: Tensor,
    advantages: Tensor,
    mask: Tensor,
    ref: Tensor | None,
    *,
    kl_coef: float,
    kl_estimator: str,
    kl_discount: float,
    clip_low: float,
    clip_high: float,
    is_clip: float,
) -> tuple[TokenLoss, Tensor]:
    """The policy loss plus ``kl_coef`` x the KL penalty per token (its ``loss``), and the per-token k3 KL
    estimate for the log (zeros without a reference). With ``kl_discount`` a token's advantage also loses
    ``kl_coef`` x the discounted later log ratios (``discounted_future_sum``)."""
    kl = torch.zeros_like(logp)
    if ref is not None and kl_coef > 0 and kl_discount > 0:
        advantages = advantages - kl_coef * discounted_future_sum(kl_log_ratio(logp, ref), mask, kl_discount)
    tl = token_loss(loss_fn, logp, old, rollout, advantages, clip_low=clip_low, clip_high=clip_high, is_clip=is_clip)
    if ref is not None and kl_coef > 0:
        value = _loss_estimate(logp, ref, kl_estimator)
        tl.loss = tl.loss + kl_coef * _weighted(value, tl.is_weight)
        # k3 as the loss's estimator is already the logged value (the same numbers): not computed again.
        kl = value.detach() if kl_estimator == "k3" else kl_estimate(logp.detach(), ref, "k3")
    return tl, kl


def kl_log_ratio(logp: Tensor, ref: Tensor) -> Tensor:
    """log(pi/ref) per token, bounded and detached: the per-token "reward" of the KL's future term."""
    return bounded(logp.detach() - ref.detach())


def discounted_future_sum(values: Tensor, mask: Tensor, discount: float) -> Tensor:
    """sum over strictly later tokens t' > t of discount^(t'-t) * values[t'], masked, per row.

    Used for the KL penalty: a token also changes the KL of the tokens after it, which the direct KL
    term does not see; subtracting kl_coef times this sum from the token's advantage adds that effect
    (score-function part of the sequence-KL gradient). discount 0 leaves it out. The values summed must
    be the log ratios log(pi/ref) (``kl_log_ratio``), whatever estimator the direct term uses: the
    score-function gradient of E_pi[sum log(pi/ref)] weighs grad log pi_t by the later log ratios; k3
    values there would be a different (always positive) penalty.
    """
    values = torch.where(mask.bool(), values, torch.zeros_like(values))
    out = torch.zeros_like(values)
    if discount == 0.0:
        return out
    running = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1] - 1, -1, -1):
        out[:, t] = discount * running
        running = values[:, t] + discount * running
    return out
