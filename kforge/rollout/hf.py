"""The transformers generation backend: batched `generate` on CPU or one GPU, LoRA adapters through PEFT.

It is the fallback when vLLM is missing and the backend of the tiny CPU preset, where it may share the
learner's in-process model (`HFBackend.from_model`).

Sampling is done by one logits processor of ours (`_SampleProcessor`) that applies
`kforge.rollout.logprobs.process_logits` (temperature, top-k, top-p) and records the log-prob of each
sampled token from the very scores it was sampled from; transformers' own warpers are switched off
(temperature 1, top_k 0, top_p 1) so nothing else reshapes the distribution. Requests with a seed are
sampled row by row from their own generator (the processor picks the token and generate() takes it
greedily), so a request's tokens do not depend on which other requests share its batch: the episode
engine batches whatever is ready, and a resumed run must still redo the same samples. Memory stays at one
`(batch, vocab)` row per step instead of the whole score history. EOS and stop strings are tracked by
our own stopping criterion, which knows exactly where each row ended.
"""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from kforge.modelio import peft_wrapping
from kforge.rollout.base import (
    BackendDefaults,
    BackendError,
    Completion,
    GenerationRequest,
    OnCompletion,
    SamplingParams,
)
from kforge.rollout.logprobs import process_logits

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from kforge.config.schema import KforgeConfig


class HFBackend(BackendDefaults):
    """`RolloutBackend` over a transformers causal LM."""

    concurrent = False  # one generate() at a time: callers batch whatever is ready

    def __init__(
        self,
        model: PreTrainedModel | PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int = 8,
        device: str | None = None,
        owns_model: bool = True,
        live_weights: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = device or str(next(model.parameters()).device)
        self.owns_model = owns_model
        # live_weights: the model is the learner's own PEFT model, so its LoRA weights are already current
        # and load_adapter only records the version.
        self.live_weights = live_weights
        self.version = 0
        self._adapter_name: str | None = None
        self._loads = 0
        self._asleep = False
        self._lock = threading.Lock()  # one generate at a time: the model is not re-entrant
        self._eos_ids = _eos_ids(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self._eos_ids)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_model(cls, model: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 8,
                   live_weights: bool | None = None) -> "HFBackend":
        """Share an in-process model (the tiny CPU mode: learner and rollouts use one copy). When the model is
        already a PEFT model, its adapter weights are taken as live unless `live_weights=False`."""
        if live_weights is None:
            live_weights = _is_peft(model)
        return cls(model, tokenizer, batch_size=batch_size, owns_model=False, live_weights=live_weights)

    @classmethod
    def from_config(cls, cfg: KforgeConfig, devices: list[int] | None = None, **kwargs: bool) -> "HFBackend":
        from kforge.modelio import load_causal_lm, load_tokenizer, resolve_model

        device = _pick_device(devices)
        ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
        tokenizer = load_tokenizer(ref, cfg.model.chat_template, cfg.model.trust_remote_code)
        model = load_causal_lm(ref, cfg.model.dtype, device, trust_remote_code=cfg.model.trust_remote_code)
        model.eval()
        return cls(model, tokenizer, batch_size=cfg.rollout.hf_batch_size, device=device, **kwargs)

    # ------------------------------------------------------------------ generation
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        for indices, batch in self._batches(requests):
            for i, completion in zip(indices, self._generate_batch(batch)):
                out[i] = completion
        return [c for c in out if c is not None]

    async def agenerate(
        self, requests: list[GenerationRequest], on_completion: OnCompletion | None = None
    ) -> list[Completion]:
        loop = asyncio.get_running_loop()
        out: list[Completion | None] = [None] * len(requests)

        def work() -> None:
            for indices, batch in self._batches(requests):
                for i, completion in zip(indices, self._generate_batch(batch)):
                    out[i] = completion
                    if on_completion is not None:
                        loop.call_soon_threadsafe(on_completion, i, completion)

        await asyncio.to_thread(work)
        await asyncio.sleep(0)  # let the scheduled callbacks run before returning
        return [c for c in out if c is not None]

    def _batches(self, requests: list[GenerationRequest]) -> list[tuple[list[int], list[GenerationRequest]]]:
        """Requests grouped by sampling settings (one generate call takes one setting), sorted by prompt
        length inside a group so that left padding stays small, cut into batches of `batch_size`."""
        groups: dict[tuple[int, float, float, int, tuple[str, ...]], list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[req.sampling.key()].append(i)
        batches = []
        for indices in groups.values():
            indices.sort(key=lambda i: len(requests[i].prompt_ids))
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                batches.append((chunk, [requests[i] for i in chunk]))
        return batches

    def _generate_batch(self, batch: list[GenerationRequest]) -> list[Completion]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        if self._asleep:
            raise BackendError("hf backend: generate() called while asleep; call wake() first")
        params = batch[0].sampling
        seeds = [r.sampling.seed for r in batch]
        row_seeded = not params.greedy and all(seed is not None for seed in seeds)
        if any(not r.prompt_ids for r in batch):
            raise BackendError("hf backend: a generation request has an empty prompt")
        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, req in enumerate(batch):  # left padding: every prompt ends at the last column
            ids[row, width - len(req.prompt_ids) :] = torch.tensor(req.prompt_ids, dtype=torch.long)
            mask[row, width - len(req.prompt_ids) :] = 1
        sampler = _SampleProcessor(params, seeds if row_seeded else None)
        stopper = _StopTracker(self.tokenizer, self._eos_ids, params.stop, width, len(batch))
        config = GenerationConfig(
            max_new_tokens=params.max_tokens,
            do_sample=not params.greedy and not row_seeded,
            # transformers' own warpers stay off; _SampleProcessor does temperature/top-k/top-p.
            temperature=1.0,
            top_k=None if params.greedy or row_seeded else 0,  # None: the default, which greedy generate() ignores
            top_p=1.0,
            min_p=None,
            typical_p=1.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            num_beams=1,
            eos_token_id=sorted(self._eos_ids),
            pad_token_id=self._pad_id,
            return_dict_in_generate=True,
        )
        with self._lock, torch.inference_mode():
            version = self.version  # under the lock: an adapter load cannot land mid-batch
            # A shared learner model may be in training mode: dropout off and the KV cache on while sampling.
            was_training = self.model.training
            self.model.eval()
            try:
                if params.seed is not None and not row_seeded:
                    torch.manual_seed(params.seed)
                result = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    generation_config=config,
                    logits_processor=LogitsProcessorList([sampler]),
                    stopping_criteria=StoppingCriteriaList([stopper]),
                )
            finally:
                if was_training:
                    self.model.train()
        sequences = result.sequences if hasattr(result, "sequences") else result
        generated = sequences[:, width:].cpu()
        logprobs = sampler.finish(generated)
        ended = stopper.lengths
        completions = []
        for row in range(len(batch)):
            n = ended[row]
            finish = "stop" if n is not None else "length"
            if n is None:
                n = min(generated.shape[1], params.max_tokens)
            tokens = generated[row, :n].tolist()
            completions.append(
                Completion(
                    token_ids=tokens,
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    logprobs=logprobs[row, :n].tolist(),
                    finish_reason=finish,
                    policy_version=version,
                )
            )
        return completions

    # ------------------------------------------------------------------ adapters and memory
    def load_adapter(self, path: str, version: int) -> None:
        """Load the PEFT LoRA folder `path` as policy version `version`; the previous adapter is deleted."""
        from pathlib import Path

        if self.live_weights:
            self.version = version
            return
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"hf backend: {path} is not a PEFT adapter folder (no adapter_config.json)")
        self._loads += 1
        name = f"v{version}_{self._loads}"  # unique even when a version is loaded twice
        with self._lock:
            if _is_peft(self.model) and self._adapter_name is not None:
                self.model.load_adapter(path, adapter_name=name, is_trainable=False)
                self.model.set_adapter(name)
                self.model.delete_adapter(self._adapter_name)
            else:
                from peft import PeftModel

                with peft_wrapping():
                    self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name, is_trainable=False)
            self.model.eval()
            self._adapter_name = name
            self.version = version

    def unload_adapter(self) -> None:
        """Back to the plain base model (removes the LoRA layers this backend added)."""
        with self._lock:
            if _is_peft(self.model) and not self.live_weights:
                self.model = self.model.unload()
                self._adapter_name = None
                self.version = 0

    def sleep(self) -> None:
        """On a GPU, move an owned model to CPU memory; a shared or CPU model stays where it is."""
        if self.owns_model and self.device.startswith("cuda") and not self._asleep:
            import torch

            with self._lock:
                self.model.to("cpu")
                torch.cuda.empty_cache()
                self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            with self._lock:
                self.model.to(self.device)
                self._asleep = False

    def close(self) -> None:
        if self.owns_model:
            self.model = None  # type: ignore[assignment]
            if self.device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()


class _SampleProcessor:
    """The only active logits processor: returns the processed scores that generate() samples from (or takes
    the argmax of), and records log p(sampled token) under them. Call k sees the token sampled at step k-1
    as the last column of `input_ids`; the final step's token is read from the returned sequences."""

    def __init__(self, params: SamplingParams, row_seeds: list[int | None] | None = None) -> None:
        self.params = params
        self.prev_logp: torch.Tensor | None = None
        self.values: list[torch.Tensor] = []
        self.row_seeds = row_seeds
        self._generators: list[torch.Generator] | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev_logp is not None:
            self.values.append(self.prev_logp.gather(-1, input_ids[:, -1:]).squeeze(-1))
        processed = process_logits(scores, self.params.temperature, self.params.top_k, self.params.top_p)
        self.prev_logp = processed.log_softmax(dim=-1)
        if self.row_seeds is None:
            return processed
        return self._pick_per_row(processed)

    def _pick_per_row(self, processed: torch.Tensor) -> torch.Tensor:
        """Sample each row from its own seeded generator; the returned scores leave generate() one choice."""
        import torch

        if self._generators is None:
            self._generators = [torch.Generator(device="cpu").manual_seed(int(s)) for s in self.row_seeds or []]
        probs = self.prev_logp.float().exp().cpu()
        picks = [int(torch.multinomial(probs[row], 1, generator=g)) for row, g in enumerate(self._generators)]
        forced = torch.full_like(processed, float("-inf"))
        rows = torch.arange(len(picks), device=processed.device)
        forced[rows, torch.tensor(picks, device=processed.device)] = 0.0
        return forced

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """`(batch, steps)` log-probs aligned with the generated tokens."""
        import torch

        steps = generated.shape[1]
        values = [v.float().cpu() for v in self.values[:steps]]
        if len(values) < steps and self.prev_logp is not None:
            last = generated[:, len(values)].to(self.prev_logp.device)
            values.append(self.prev_logp.gather(-1, last[:, None]).squeeze(-1).float().cpu())
        if not values:
            return torch.zeros((generated.shape[0], 0))
        return torch.stack(values, dim=1)


class _StopTracker:
    """Stopping criterion for EOS and stop strings that also records where each row ended (the rows that
    stopped are padded afterwards, and the pad token may equal EOS, so the sequences alone cannot tell).
    EOS is checked on the device without a sync; stop strings need the text, so they cost one sync a step."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int], stop: list[str], prompt_width: int,
                 batch: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = sorted(eos_ids)
        self.stop = [s for s in stop if s]
        self.width = prompt_width
        self.batch = batch
        self._ended: torch.Tensor | None = None  # (batch,) generated length at the end, -1 while running
        self._eos: torch.Tensor | None = None
        # Tokens are at least one character in practice, so a stop string fits in this many last tokens.
        self.tail = max((len(s) for s in self.stop), default=0) + 2

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        import torch

        if self._ended is None:
            self._ended = torch.full((input_ids.shape[0],), -1, dtype=torch.long, device=input_ids.device)
            self._eos = torch.tensor(self.eos_ids, dtype=input_ids.dtype, device=input_ids.device)
        n = input_ids.shape[1] - self.width
        running = self._ended < 0
        hit = torch.isin(input_ids[:, -1], self._eos)
        if self.stop:
            start = max(self.width, input_ids.shape[1] - self.tail)
            for row in running.nonzero().flatten().tolist():
                text = self.tokenizer.decode(input_ids[row, start:].tolist(), skip_special_tokens=False)
                if any(s in text for s in self.stop):
                    hit[row] = True
        self._ended = torch.where(running & hit, torch.full_like(self._ended, n), self._ended)
        return self._ended >= 0

    @property
    def lengths(self) -> list[int | None]:
        """Per row: the number of generated tokens up to and including the one that ended it, or None."""
        if self._ended is None:
            return [None] * self.batch
        return [None if v < 0 else int(v) for v in self._ended.tolist()]


def _eos_ids(model: PreTrainedModel | PeftModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    config = getattr(model, "generation_config", None)
    value = getattr(config, "eos_token_id", None) if config is not None else None
    if isinstance(value, int):
        ids.add(value)
    elif isinstance(value, (list, tuple)):
        ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise BackendError("hf backend: neither the tokenizer nor the model names an EOS token")
    return ids


def _is_peft(model: object) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _pick_device(devices: list[int] | None) -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda:{devices[0]}" if devices else "cuda:0"
    except Exception:
        pass
    return "cpu"
