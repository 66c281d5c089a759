"""The learner: one GRPO-family update of a LoRA adapter per batch of samples.

``train_step`` splits the batch into ``learner.num_substeps`` minibatches (one optimiser step each),
packs each minibatch into micro-batches under ``learner.micro_batch_tokens`` (padded rows x length),
accumulates gradients over the micro-batches, clips the gradient norm and steps AdamW and the
learning-rate schedule.

Log-prob convention: log_softmax(logits / temperature) of each response token, at the position before
it, with ``temperature`` a constructor argument (1.0 by default). The rollout engine's log-probs
(``Sample.rollout_logprobs``) must be computed the same way for the importance ratios to be near 1.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from kforge.learner import checkpoint as ckpt
from kforge.learner.batching import MicroBatch, collate, plan_micro_batches
from kforge.learner.logprobs import response_logits, token_entropy, token_logprobs
from kforge.learner.lora import (
    LearnerError,
    attach_lora,
    enable_gradient_checkpointing,
    load_adapter_weights,
    load_base,
    trainable_parameters,
)
from kforge.learner.losses import aggregate, discounted_future_sum, kl_estimate, reduction_for, token_loss
from kforge.learner.samples import Sample
from kforge.learner.schedule import make_scheduler

if TYPE_CHECKING:  # the config stack (pydantic) is not needed at run time here
    from kforge.config.schema import KforgeConfig

STATE_FILE = "trainer_state.pt"
# Every key of train_step's metrics, in log order.
METRIC_KEYS = (
    "loss", "kl", "entropy", "clip_fraction", "is_ratio_mean", "is_ratio_max", "is_clip_fraction",
    "rollout_logprob_diff", "grad_norm", "grad_norm_max", "tokens", "response_tokens", "tokens_per_s",
    "samples", "step_s", "lr", "optimizer_steps", "version", "skipped",
)


@dataclass
class _Sums:
    """Token-weighted running sums for the step's metrics."""

    tokens: float = 0.0
    values: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, per_token: Tensor, mask: Tensor) -> None:
        picked = per_token.detach().float()[mask]
        self.values[name] = self.values.get(name, 0.0) + float(picked.sum().item())
        if picked.numel():
            self.maxima[name] = max(self.maxima.get(name, float("-inf")), float(picked.max().item()))

    def mean(self, name: str) -> float:
        return self.values.get(name, 0.0) / self.tokens if self.tokens else 0.0


class Learner:
    """PEFT LoRA policy + AdamW + schedule, updated by ``train_step``.

    ``model``/``tokenizer`` may be given (a transformers causal LM, or an existing PeftModel);
    otherwise they are loaded from ``cfg.model`` via kforge.modelio. ``cfg.model.checkpoint`` names an
    adapter folder (or a learner checkpoint) whose adapter weights the run starts from.
    ``total_steps`` (train_step calls) overrides ``cfg.max_steps`` for the schedule.
    """

    def __init__(
        self,
        cfg: KforgeConfig,
        device: str = "cpu",
        model: Any = None,
        tokenizer: Any = None,
        total_steps: int | None = None,
        temperature: float = 1.0,
    ) -> None:
        if temperature <= 0:
            raise LearnerError(f"learner temperature {temperature}: must be > 0 (use 1.0 for greedy rollouts)")
        self.cfg = cfg
        self.device = torch.device(device)
        self.temperature = float(temperature)
        if model is None:
            model, loaded_tokenizer = load_base(cfg, device)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        elif not _is_quantized_model(model):
            model = model.to(self.device)
        self.model = attach_lora(model, cfg)
        self.tokenizer = tokenizer
        if cfg.model.gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        self.pad_id = _pad_id(tokenizer, self.model)

        self.params = trainable_parameters(self.model)
        if not self.params:
            raise LearnerError("the model has no trainable parameters; check lora.target_modules")
        lc = cfg.learner
        self.optimizer = torch.optim.AdamW(self.params, lr=lc.learning_rate, weight_decay=lc.weight_decay)
        steps = total_steps if total_steps is not None else cfg.max_steps
        self.total_optimizer_steps = steps * lc.num_substeps if steps is not None else None
        try:
            self.scheduler = make_scheduler(self.optimizer, lc.warmup_steps, self.total_optimizer_steps, lc.lr_schedule)
        except ValueError as exc:
            raise LearnerError(str(exc)) from None
        self.version = 0  # train_step calls so far (adapter version)
        self.optimizer_steps = 0

    # ------------------------------------------------------------------ training

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One update from a batch of samples; returns this step's metrics."""
        started = time.perf_counter()
        lc = self.cfg.learner
        for s in samples:
            if not s.prompt_ids:
                raise LearnerError(f"sample {s.problem_key} turn {s.turn_index}: empty prompt; every sample needs prompt tokens")
        samples = [s for s in samples if s.response_ids]
        if not samples:  # e.g. every group had constant returns: nothing to learn from
            self.version += 1
            metrics = dict.fromkeys(METRIC_KEYS, 0.0)
            metrics.update(skipped=1.0, is_ratio_mean=1.0, is_ratio_max=1.0, lr=self._lr(),
                           optimizer_steps=float(self.optimizer_steps), version=float(self.version))
            return metrics

        # A fixed shuffle per version, so a resumed run splits its minibatches the same way. With fewer
        # samples than num_substeps, there are fewer (one-sample) optimiser steps.
        order = list(range(len(samples)))
        random.Random(self.version).shuffle(order)
        n_mini = min(lc.num_substeps, len(samples))
        minibatches = [[samples[i] for i in order[k::n_mini]] for k in range(n_mini)]

        old_logps = self._old_logprobs(minibatches) if n_mini > 1 else None
        sums, stats = _Sums(), {"loss": 0.0, "grad_norm": 0.0, "grad_norm_max": 0.0, "tokens": 0.0}
        for m, mini in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            loss_value = self._accumulate(mini, old_logps[m] if old_logps else None, sums, stats)
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, lc.grad_clip).item())
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer_steps += 1
            stats["loss"] += loss_value / n_mini
            stats["grad_norm"] += norm / n_mini
            stats["grad_norm_max"] = max(stats["grad_norm_max"], norm)

        # Leave the model as generation wants it (no LoRA dropout) for a backend that shares it.
        self.model.eval()
        self.version += 1
        elapsed = time.perf_counter() - started
        has_is = sums.values.get("_is_tokens", 0.0)
        metrics = {
            "loss": stats["loss"],
            "kl": sums.mean("kl"),
            "entropy": sums.mean("entropy"),
            "clip_fraction": sums.mean("clipped"),
            "is_ratio_mean": sums.values.get("is_ratio", 0.0) / has_is if has_is else 1.0,
            "is_ratio_max": sums.maxima.get("is_ratio", 1.0) if has_is else 1.0,
            "is_clip_fraction": sums.values.get("is_clipped", 0.0) / has_is if has_is else 0.0,
            "rollout_logprob_diff": sums.values.get("logp_diff", 0.0) / has_is if has_is else 0.0,
            "grad_norm": stats["grad_norm"],
            "grad_norm_max": stats["grad_norm_max"],
            "tokens": stats["tokens"],
            "response_tokens": sums.tokens,
            "tokens_per_s": stats["tokens"] / elapsed if elapsed > 0 else 0.0,
            "samples": float(len(samples)),
            "step_s": elapsed,
            "lr": self._lr(),
            "optimizer_steps": float(self.optimizer_steps),
            "version": float(self.version),
            "skipped": 0.0,
        }
        return metrics

    def _accumulate(self, mini: list[Sample], old: list[Tensor] | None, sums: _Sums, stats: dict[str, float]) -> float:
        """Forward/backward over the micro-batches of one minibatch; returns its loss."""
        lc = self.cfg.learner
        mode = reduction_for(lc.loss_fn, lc.loss_aggregation)
        totals = dict(
            total_tokens=float(sum(len(s.response_ids) for s in mini)),
            total_seqs=float(len(mini)),
            const_len=float(self.cfg.rollout.max_tokens),
        )
        plan = plan_micro_batches([s.num_tokens for s in mini], lc.micro_batch_tokens)
        loss_total = 0.0
        for indices in plan:
            batch = collate(mini, indices, self.pad_id, self.device)
            mask = batch.response_mask
            ref = self._reference_logprobs(batch) if lc.kl_coef > 0 else None
            self.model.train()
            logits = response_logits(self.model, batch)
            logp = token_logprobs(logits, batch.targets, self.temperature)
            entropy = token_entropy(logits, self.temperature)
            del logits
            old_lp = self._gather_old(old, batch, logp) if old is not None else logp.detach()
            rollout = torch.where(batch.has_rollout, batch.rollout_logprobs, old_lp)

            advantages = batch.advantages
            kl = torch.zeros_like(logp)
            if ref is not None:
                kl = kl_estimate(logp, ref, lc.kl_estimator)
                if lc.kl_discount > 0:
                    advantages = advantages - lc.kl_coef * discounted_future_sum(kl.detach(), mask, lc.kl_discount)
            tl = token_loss(
                lc.loss_fn, logp, old_lp, rollout, advantages,
                clip_low=lc.clip_low, clip_high=lc.clip_high, is_clip=lc.is_clip,
            )
            loss = aggregate(tl.loss, mask, mode, **totals)
            if ref is not None:
                loss = loss + lc.kl_coef * aggregate(kl, mask, mode, **totals)
            loss.backward()
            loss_total += float(loss.detach().item())

            sums.tokens += float(mask.sum().item())
            stats["tokens"] += float(batch.real_tokens)
            sums.add("kl", kl, mask)
            sums.add("entropy", entropy, mask)
            sums.add("clipped", tl.clipped.float(), mask)
            is_mask = mask & batch.has_rollout
            sums.values["_is_tokens"] = sums.values.get("_is_tokens", 0.0) + float(is_mask.sum().item())
            sums.add("is_ratio", tl.ratio if lc.loss_fn == "importance_sampling" else torch.exp(old_lp - rollout), is_mask)
            sums.add("is_clipped", tl.is_clipped.float(), is_mask)
            sums.add("logp_diff", (old_lp - rollout).abs(), is_mask)
        return loss_total

    @torch.no_grad()
    def _old_logprobs(self, minibatches: list[list[Sample]]) -> list[list[Tensor]]:
        """Log-probs of every response under the weights the batch arrived at (before any substep)."""
        self.model.eval()
        out: list[list[Tensor]] = []
        for mini in minibatches:
            per_sample: list[Tensor] = [torch.empty(0)] * len(mini)
            plan = plan_micro_batches([s.num_tokens for s in mini], self.cfg.learner.micro_batch_tokens)
            for indices in plan:
                batch = collate(mini, indices, self.pad_id, self.device)
                logp = token_logprobs(response_logits(self.model, batch), batch.targets, self.temperature)
                for row, i in enumerate(indices):
                    k = len(mini[i].response_ids)
                    per_sample[i] = logp[row, logp.shape[1] - k:].clone()
            out.append(per_sample)
        return out

    @staticmethod
    def _gather_old(old: list[Tensor], batch: MicroBatch, like: Tensor) -> Tensor:
        result = torch.zeros_like(like)
        for row, i in enumerate(batch.indices):
            k = old[i].shape[0]
            result[row, like.shape[1] - k:] = old[i]
        return result.detach()

    @torch.no_grad()
    def _reference_logprobs(self, batch: MicroBatch) -> Tensor:
        """Log-probs under the base model: the same network with the adapter switched off."""
        was_training = self.model.training
        self.model.eval()
        with self.model.disable_adapter():
            ref = token_logprobs(response_logits(self.model, batch), batch.targets, self.temperature)
        self.model.train(was_training)
        return ref

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ saving and loading

    def save_adapter(self, path: str | Path) -> None:
        """PEFT adapter folder (adapter_config.json + adapter_model.safetensors), written atomically."""
        with ckpt.atomic_folder(path) as tmp:
            self.model.save_pretrained(str(tmp), safe_serialization=True)

    def save_checkpoint(self, path: str | Path) -> None:
        """Adapter + optimizer + scheduler + RNG states + counters, written atomically."""
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "version": self.version,
            "optimizer_steps": self.optimizer_steps,
        }
        with ckpt.atomic_folder(path) as tmp:
            self.model.save_pretrained(str(tmp / "adapter"), safe_serialization=True)
            torch.save(state, tmp / STATE_FILE)
            meta = {"version": self.version, "optimizer_steps": self.optimizer_steps, "loss_fn": self.cfg.learner.loss_fn}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote: the next train_step then matches an uninterrupted run."""
        folder = ckpt.resolve_checkpoint(path)
        state_file = folder / STATE_FILE
        if not state_file.is_file():
            raise LearnerError(f"checkpoint {path}: no {STATE_FILE} there; is it a learner checkpoint folder?")
        load_adapter_weights(self.model, folder / "adapter")
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.version = int(state["version"])
        self.optimizer_steps = int(state["optimizer_steps"])


def _is_quantized_model(model: Any) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "hf_device_map", None))


def _pad_id(tokenizer: Any, model: Any) -> int:
    """Any valid id works (pads are masked out); prefer the tokenizer's pad, then eos, then 0."""
    for source in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
    return 0
