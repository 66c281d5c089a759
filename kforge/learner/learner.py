"""The learner: one GRPO-family update of a LoRA adapter per batch of samples.

``train_step`` splits the batch into ``learner.num_substeps`` minibatches (one optimiser step each),
accumulates each minibatch's gradients over its micro-batches (kforge.learner.accumulation: the plan under
``learner.micro_batch_tokens``, the loss, the out-of-memory retry, the old log-probs), clips the gradient
norm and steps AdamW and the learning-rate schedule (once per optimiser step, applied or skipped).

Log-prob convention: ``kforge.learner.logprobs`` with the sampler's temperature and top-k/top-p (the
run's ``SamplingParams`` record, a required constructor argument), the same processing the sampler applied, so that
the rollout engine's log-probs (``Sample.rollout_logprobs``) and the learner's give importance ratios near 1.

Guards, each reported in the metrics:
- an optimiser step whose loss or gradient norm is not finite is skipped (``nonfinite_steps``);
- a micro-batch that runs out of memory is retried alone, split under half the token budget, down to
  single samples (``oom_retries``, kforge.learner.accumulation);
- sequences with an extreme rollout/learner mismatch are dropped (``mismatch_rejected``).

Dropout: the old log-probs of substeps after the first are computed in train mode under the same seeded
dropout masks as the update's forward pass, and the first substep uses the update's own log-probs, so
ratios measure the weight change only (with LoRA dropout the ratio at substep 0 is exactly 1); the seeds
are drawn here, once per batch, from the global RNG that checkpoints save.

KL reference: the policy the run started from: the base model (a fresh adapter is zero) or, with
``model.checkpoint``, a frozen second copy of that adapter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from kforge.credit.samples import Sample
from kforge.learner import checkpoint as ckpt
from kforge.learner import varlen
from kforge.learner.accumulation import Accumulation
from kforge.learner.batching import MicroBatch
from kforge.learner.ddp import Ranks
from kforge.learner.logprobs import response_logprobs
from kforge.learner.lora import (
    LearnerError,
    attach_lora,
    attach_reference,
    bf16_compute,
    enable_gradient_checkpointing,
    has_dropout,
    is_quantized_model,
    load_adapter_weights,
    load_base,
    pad_id_of,
    save_adapter_folder,
    trainable_parameters,
)
from kforge.learner.recompute import choose_for
from kforge.learner.rng import mix_seed
from kforge.learner.schedule import make_scheduler
from kforge.learner.sums import METRIC_KEYS, Sums, step_metrics

if TYPE_CHECKING:  # annotations only: the config stack (pydantic) and transformers are not needed at run time here
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from kforge.config.schema import KforgeConfig
    from kforge.rollout.base import SamplingParams

log = logging.getLogger("kforge.learner")

__all__ = ["METRIC_KEYS", "Learner"]


class Learner:
    """PEFT LoRA policy + AdamW + schedule, updated by ``train_step``.

    ``model``/``tokenizer`` may be given (a transformers causal LM, or an existing PeftModel);
    otherwise they are loaded from ``cfg.model`` via kforge.modelio. ``cfg.model.checkpoint`` names an
    adapter folder (or a learner checkpoint) whose adapter weights the run starts from.
    ``total_steps`` (train_step calls) overrides ``cfg.max_steps`` for the schedule. ``sampling``: the sampler's
    settings (temperature, top-k/top-p, max_tokens), required: the learner scores every token under the
    distribution it was sampled from, and a caller outside a run states the one it means. ``ranks``: this
    process's place in a data-parallel group (kforge.learner.ddp); none is one rank.
    """

    def __init__(
        self,
        cfg: KforgeConfig,
        device: str = "cpu",
        model: PreTrainedModel | PeftModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        total_steps: int | None = None,
        *,
        sampling: SamplingParams,
        ranks: Ranks | None = None,
        reserve_gib: float = 0.0,
    ) -> None:
        s = self.sampling = sampling
        if s.temperature <= 0:
            raise LearnerError(f"learner temperature {s.temperature}: must be > 0 (use 1.0 for greedy rollouts)")
        self.cfg = cfg
        self.device = torch.device(device)
        # The sampler's settings: the learner must score tokens under the distribution they came from.
        self.temperature, self.top_k, self.top_p = float(s.temperature), int(s.top_k), float(s.top_p)
        if model is None:
            model, loaded_tokenizer = load_base(cfg, device)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        elif not is_quantized_model(model):
            model = model.to(self.device)
        self.model = attach_lora(model, cfg)
        self.adapter = self.model.active_adapter
        self.reference: str | None = None
        if cfg.model.checkpoint and cfg.learner.kl_coef > 0:
            self.reference = attach_reference(self.model, cfg.model.checkpoint)
        self.tokenizer = tokenizer
        # `reserve_gib`: what other processes keep on the learner's GPU while it trains (an `auto` share's budget).
        self.recompute = choose_for(self.model, cfg, self.device, reserve_gib) if cfg.model.gradient_checkpointing else None
        if self.recompute is not None:
            enable_gradient_checkpointing(self.model, self.recompute.share)
            (log.info if self.recompute.fits else log.warning)("%s", self.recompute.why)
        self.pad_id = pad_id_of(tokenizer, self.model)
        self.pack = cfg.learner.pack  # packed rows, attention per sample (kforge.learner.packing)
        if self.pack:
            varlen.install(self.model)
        self.dropout = has_dropout(self.model)

        self.params = trainable_parameters(self.model)
        if not self.params:
            raise LearnerError("the model has no trainable parameters; check lora.target_modules")
        self.ranks = ranks or Ranks()
        self.ranks.broadcast_params(self.params)
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
        # Every rank splits the whole batch alike and then keeps its own shard of each minibatch.
        minibatches = [self.ranks.shard([samples[i] for i in order[k::n_mini]]) for k in range(n_mini)]
        # Drawn from the global RNG (saved in checkpoints), so a resumed run draws the same masks.
        seed = self.ranks.broadcast_int(int(torch.randint(0, 2**31 - 1, (1,)).item()) if self.dropout else None)

        # The micro-batches of each minibatch, and the old log-probs under their plan (kforge.learner.accumulation).
        work = Accumulation(self, keep_arrival=self.dropout and n_mini > 1)
        old_logps = work.old_logprobs(minibatches, seed) if n_mini > 1 else None
        sums, stats = Sums(), {"loss": 0.0, "grad_norm": 0.0, "grad_norm_max": 0.0, "tokens": 0.0}
        applied = skipped = 0
        for m, mini in enumerate(minibatches):
            self.optimizer.zero_grad(set_to_none=True)
            # Minibatch 0 meets the weights the batch arrived at: its own log-probs are the old ones.
            old = old_logps[m] if old_logps is not None and m > 0 else None
            loss_value = self.ranks.sum_floats([work.minibatch(mini, old, sums, stats, mix_seed(seed, m))])[0]
            self.ranks.sum_grads(self.params)  # every rank now holds the whole minibatch's gradient
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, lc.grad_clip).item())
            if math.isfinite(loss_value) and math.isfinite(norm):
                self.optimizer.step()
                self.optimizer_steps += 1
                applied += 1
                stats["loss"] += loss_value
                stats["grad_norm"] += norm
                stats["grad_norm_max"] = max(stats["grad_norm_max"], norm)
            else:  # never let NaN/inf reach the adapter or AdamW's moments
                skipped += 1
                log.warning("optimiser step skipped: loss %s, gradient norm %s", loss_value, norm)
                self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()  # the schedule follows the planned steps, applied or skipped

        # Leave the model as generation wants it (no LoRA dropout) for a backend that shares it.
        self.model.eval()
        self.version += 1
        self.ranks.merge(sums, stats)
        sums.count("nonfinite_steps", float(skipped))  # a step every rank skipped alike, counted once
        elapsed = time.perf_counter() - started
        return step_metrics(sums, stats, applied, len(samples), elapsed, self._lr(), self.optimizer_steps, self.version)

    @torch.no_grad()
    def reference_logprobs(self, batch: MicroBatch) -> Tensor:
        """Log-probs under the starting policy: the frozen reference adapter, else the base model (the same
        network with the adapter switched off; a fresh adapter is zero, so that is where the run started)."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.reference is not None:
                self.model.set_adapter(self.reference, inference_mode=True)
            with self.model.disable_adapter() if self.reference is None else contextlib.nullcontext():
                logp, _ = self.logprobs(batch)
        finally:
            if self.reference is not None:
                self.model.set_adapter(self.adapter)  # trainable again
            self.model.train(was_training)
        return logp

    def logprobs(self, batch: MicroBatch, entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """Response log-probs (and entropy) of ``batch`` under the model as it is now (see response_logprobs): the
        learner's one path (chunked, under its autocast), which `kforge sft`'s held-out loss reads too."""
        with bf16_compute(self.model, self.device, self.cfg.learner.bf16_autocast):
            return response_logprobs(self.model, batch, self.temperature, self.top_k, self.top_p,
                                     chunk=self.cfg.learner.logprob_chunk, entropy=entropy, entropy_grad=entropy_grad)

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ saving and loading

    def save_adapter(self, path: str | Path, dtype: str | None = None) -> None:
        """PEFT adapter folder (adapter_config.json + adapter_model.safetensors), written atomically (a reader
        sees the whole folder or none); ``dtype`` casts the weights (the rollout engine's copy: bfloat16)."""
        with ckpt.atomic_folder(path) as tmp:
            save_adapter_folder(self.model, self.adapter, tmp, dtype)

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
            self.model.save_pretrained(str(tmp / "adapter"), safe_serialization=True, selected_adapters=[self.adapter])
            torch.save(state, tmp / ckpt.STATE_FILE)
            meta = {"version": self.version, "optimizer_steps": self.optimizer_steps, "loss_fn": self.cfg.learner.loss_fn}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what ``save_checkpoint`` wrote: the next train_step then matches an uninterrupted run."""
        folder, state = ckpt.read_state(path)
        load_adapter_weights(self.model, folder / "adapter")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.version = int(state["version"])
        self.optimizer_steps = int(state["optimizer_steps"])
