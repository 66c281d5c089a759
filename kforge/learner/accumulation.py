"""Gradient accumulation: one minibatch's forward and backward passes, micro-batch by micro-batch.

What happens between two of the Learner's optimiser steps (kforge.learner.learner owns the model, the
optimiser, the schedule and the split of a batch into minibatches). This module owns:

- the plan: a minibatch in micro-batches under ``learner.micro_batch_tokens`` (padded rows x length, or real
  tokens of one packed row with ``learner.pack``, see kforge.learner.packing);
- each micro-batch's loss and gradients (the loss of kforge.learner.losses on the learner's log-probs), with
  the normalisers of the whole minibatch summed over the data-parallel ranks;
- the accumulation: a micro-batch's gradients are added to the parameters' ``.grad`` only once its backward
  pass completed, so nothing is counted twice;
- the out-of-memory retry: a micro-batch that runs out of memory is retried alone, split under half the token
  budget, down to single samples (``oom_retries``);
- the old log-probs of the substeps after the first, in train mode under the same plan and seeded dropout
  masks as the update's forward passes. An out-of-memory split draws new masks for its halves, so their old
  log-probs are taken again under those masks and the adapter as the batch arrived (a LoRA-sized copy kept
  for the step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from kforge.config.losses import loss_rule
from kforge.learner.lora import release_memory
from kforge.learner.losses import aggregate, mismatch_rejected, reduction_for, regularised_token_loss
from kforge.learner.packing import collate_any, plan
from kforge.learner.rng import dropout_masks, mix_seed
from kforge.learner.sums import Done, Sums

if TYPE_CHECKING:  # annotations only: the config stack (pydantic) and PEFT are not needed at run time here
    from peft import PeftModel

    from kforge.config.schema import KforgeConfig
    from kforge.credit.samples import Sample
    from kforge.learner.batching import MicroBatch
    from kforge.learner.ddp import Ranks
    from kforge.rollout.base import SamplingParams


class Policy(Protocol):
    """What accumulation reads of the learner (kforge.learner.learner.Learner): its model, trainable parameters,
    settings, data-parallel ranks and the sampler's settings, and its two log-prob paths."""

    cfg: KforgeConfig
    model: PeftModel
    params: list[torch.nn.Parameter]
    device: torch.device
    pad_id: int
    pack: bool
    ranks: Ranks
    sampling: SamplingParams

    def logprobs(self, batch: MicroBatch, entropy: bool = False,
                 entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]: ...

    def reference_logprobs(self, batch: MicroBatch) -> Tensor: ...


class Accumulation:
    """One train_step's micro-batch work on ``policy``. ``keep_arrival``: keep the adapter as the batch arrived
    (LoRA only: small), for old log-probs redone after an out-of-memory split; only dropout with several
    minibatches needs it."""

    def __init__(self, policy: Policy, keep_arrival: bool) -> None:
        self.policy = policy
        self.arrival = [p.detach().clone() for p in policy.params] if keep_arrival else None

    def minibatch(self, mini: list[Sample], old: list[Tensor] | None, sums: Sums, stats: dict[str, float],
                  seed: int | None) -> float:
        """Forward/backward over the micro-batches of one minibatch, their gradients added to the parameters'
        ``.grad``; returns its loss. ``old``: the minibatch's old log-probs per sample (None: its own)."""
        pol = self.policy
        lc = pol.cfg.learner
        # The normalisers are the whole minibatch's, summed over the ranks' shards.
        tokens, seqs = pol.ranks.sum_floats([float(sum(len(s.response_ids) for s in mini)), float(len(mini))])
        totals = dict(total_tokens=tokens, total_seqs=seqs, const_len=float(pol.sampling.max_tokens))
        loss_total = 0.0
        for j, indices in enumerate(plan([s.num_tokens for s in mini], lc.micro_batch_tokens, pol.pack)):
            for done in self._with_retry(mini, indices, old, totals, mix_seed(seed, j), lc.micro_batch_tokens, sums):
                for p, g in zip(pol.params, done.grads):
                    if g is not None:
                        p.grad = g if p.grad is None else p.grad.add_(g)
                done.record(sums, stats)
                loss_total += done.loss
        return loss_total

    def _with_retry(self, mini: list[Sample], indices: list[int], old: list[Tensor] | None,
                    totals: dict[str, float], seed: int | None, budget: int, sums: Sums) -> list[Done]:
        """One micro-batch; out of memory, the same samples again in micro-batches under half the budget."""
        try:
            return [self._micro(mini, indices, old, totals, seed)]
        except torch.OutOfMemoryError:
            if len(indices) == 1:
                raise
        release_memory(self.policy.device)
        sums.count("oom_retries", 1.0)
        half = max(1, budget // 2)
        parts = plan([mini[i].num_tokens for i in indices], half, self.policy.pack)
        if len(parts) == 1:  # the halved budget still fits them all: split the rows in two
            parts = [list(range(len(indices) // 2)), list(range(len(indices) // 2, len(indices)))]
        out: list[Done] = []
        for k, part in enumerate(parts):
            part_indices, part_seed = [indices[i] for i in part], mix_seed(seed, 1000 + k)
            if old is not None and self.arrival is not None:
                # New micro-batches draw new dropout masks: their old log-probs must be taken under the
                # same masks (and the arrival weights), or the ratio measures the masks, not the update.
                self._redo_old_logprobs(mini, part_indices, part_seed, old)
            out += self._with_retry(mini, part_indices, old, totals, part_seed, half, sums)
        return out

    def _micro(self, mini: list[Sample], indices: list[int], old: list[Tensor] | None,
               totals: dict[str, float], seed: int | None) -> Done:
        """Loss and gradients of one micro-batch. Nothing is written to the parameters' .grad here."""
        pol = self.policy
        lc = pol.cfg.learner
        mode = reduction_for(lc.loss_fn, lc.loss_aggregation)
        batch = collate_any(mini, indices, pol.pad_id, pol.device, pol.pack)
        mask = batch.response_mask
        ref = pol.reference_logprobs(batch) if lc.kl_coef > 0 else None
        pol.model.train()
        with dropout_masks(seed, pol.device):
            logp, entropy = pol.logprobs(batch, entropy=True, entropy_grad=lc.entropy_coef > 0)
        old_lp = _gather_old(old, batch, logp) if old is not None else logp.detach()
        rollout = torch.where(batch.has_rollout, batch.rollout_logprobs, old_lp)
        rejected = mismatch_rejected(old_lp, rollout, mask, batch.has_rollout,
                                     max_ratio=lc.mismatch_reject_ratio, token_veto=lc.mismatch_token_veto)
        # Rejected sequences add nothing; the normaliser (totals) still counts them.
        keep = mask & ~rejected.unsqueeze(-1)

        tl, kl = regularised_token_loss(
            lc.loss_fn, logp, old_lp, rollout, batch.advantages, mask, ref,
            kl_coef=lc.kl_coef, kl_estimator=lc.kl_estimator, kl_discount=lc.kl_discount,
            clip_low=lc.clip_low, clip_high=lc.clip_high, is_clip=lc.is_clip,
        )
        loss = aggregate(tl.loss, keep, mode, **totals)
        if lc.entropy_coef > 0:
            loss = loss - lc.entropy_coef * aggregate(entropy, keep, mode, **totals)
        grads = [*torch.autograd.grad(loss, pol.params, allow_unused=True)] if loss.requires_grad else [None] * len(pol.params)
        loss_value = float(loss.detach().item())

        def record(sums: Sums, stats: dict[str, float]) -> None:
            sums.tokens += float(mask.sum().item())
            stats["tokens"] += float(batch.real_tokens)
            sums.add("kl", kl, mask)
            sums.add("entropy", entropy, mask)
            sums.add("clipped", tl.clipped.float(), mask)
            sums.count("mismatch_rejected", float(rejected.sum().item()))
            is_mask, truncated_is = mask & batch.has_rollout, loss_rule(lc.loss_fn).surrogate == "truncated_is"
            sums.count("_is_tokens", float(is_mask.sum().item()))
            sums.add("is_ratio", tl.ratio if truncated_is else torch.exp(old_lp - rollout), is_mask)
            sums.add("is_clipped", tl.is_clipped.float(), is_mask)
            sums.add("logp_diff", (old_lp - rollout).abs(), is_mask)

        return Done(loss_value, grads, record)

    @torch.no_grad()
    def old_logprobs(self, minibatches: list[list[Sample]], seed: int | None) -> list[list[Tensor]]:
        """Log-probs of every response under the weights the batch arrived at (before any substep), in
        train mode with the dropout masks the update's forward pass will draw (same seeds, same plan)."""
        pol = self.policy
        out: list[list[Tensor]] = []
        for m, mini in enumerate(minibatches):
            per_sample: list[Tensor] = [torch.empty(0)] * len(mini)
            if m > 0:  # minibatch 0 uses the update's own log-probs
                lengths = [s.num_tokens for s in mini]
                for j, indices in enumerate(plan(lengths, pol.cfg.learner.micro_batch_tokens, pol.pack)):
                    self._rows_logprobs(mini, indices, mix_seed(mix_seed(seed, m), j), per_sample)
            out.append(per_sample)
        pol.model.eval()
        return out

    @torch.no_grad()
    def _rows_logprobs(self, mini: list[Sample], indices: list[int], seed: int | None, into: list[Tensor]) -> None:
        """Train-mode log-probs of ``mini[indices]`` as one micro-batch under ``seed``'s dropout masks."""
        pol = self.policy
        pol.model.train()
        batch = collate_any(mini, indices, pol.pad_id, pol.device, pol.pack)
        with dropout_masks(seed, pol.device):
            logp, _ = pol.logprobs(batch)
        for row, i in enumerate(indices):
            into[i] = logp[row, logp.shape[1] - len(mini[i].response_ids):].clone()

    @torch.no_grad()
    def _redo_old_logprobs(self, mini: list[Sample], indices: list[int], seed: int | None, old: list[Tensor]) -> None:
        """Old log-probs of ``mini[indices]`` again, under the arrival weights and ``seed``'s masks."""
        params = self.policy.params
        current = [p.detach().clone() for p in params]
        try:
            for p, a in zip(params, self.arrival or []):
                p.copy_(a)
            self._rows_logprobs(mini, indices, seed, old)
        finally:
            for p, c in zip(params, current):
                p.copy_(c)


def _gather_old(old: list[Tensor], batch: MicroBatch, like: Tensor) -> Tensor:
    """The old log-probs of ``batch``'s samples, right-aligned in a tensor shaped like its log-probs."""
    result = torch.zeros_like(like)
    for row, i in enumerate(batch.indices):
        k = old[i].shape[0]
        result[row, like.shape[1] - k:] = old[i]
    return result.detach()
