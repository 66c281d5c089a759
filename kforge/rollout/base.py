"""The one interface every generation backend implements, and the factory that picks one.

Backends take token ids, not text: the prompt builder owns the chat template, so the ids a turn was
trained on are exactly the ids the engine saw.

Log-prob convention (shared with the learner, see `kforge.rollout.logprobs`): `Completion.logprobs[i]`
is the log-probability of `token_ids[i]` under the distribution the token was sampled from, i.e.
`log_softmax(process_logits(logits, temperature, top_k, top_p))`: logits divided by the temperature
(temperature 0, greedy, counts as 1), then top-k / top-p truncation with renormalisation. This is what
vLLM calls `logprobs_mode="processed_logprobs"`. With top_p = 1 and top_k = -1 (every preset) it is
plainly `log_softmax(logits / temperature)`; the learner computes its log-probs with the same function.
"""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig


class BackendError(RuntimeError):
    """A generation backend could not start or failed; the message is one line for the user."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = off
    stop: list[str] = field(default_factory=list)  # generation ends after the text contains one of these
    seed: int | None = None  # vLLM: per request; hf: seeds the batch (requests with other seeds batch apart)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one batched call of an engine that takes one setting."""
        return (self.max_tokens, self.temperature, self.top_p, self.top_k, tuple(self.stop), self.seed)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, the final EOS included when one was sampled
    text: str  # decode(token_ids) without special tokens; a matched stop string stays in the text
    logprobs: list[float]  # one per token id, see the convention above
    finish_reason: str  # "stop" (EOS or a stop string) | "length"


OnCompletion = Callable[[int, Completion], None]


@runtime_checkable
class RolloutBackend(Protocol):
    tokenizer: Any

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Completions in request order."""
        ...

    async def agenerate(
        self, requests: list[GenerationRequest], on_completion: OnCompletion | None = None
    ) -> list[Completion]:
        """Like `generate`, without blocking the event loop. `on_completion(index, completion)` is called on
        the loop's thread as soon as a completion is ready (some backends finish in several sub-batches), so
        the caller can start evaluating it while the rest is still generating."""
        ...

    def load_adapter(self, path: str, version: int) -> None:
        """Sample from now on with the PEFT LoRA adapter saved in folder `path` (policy version `version`)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory for the learner until `wake()`."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


async def run_in_thread(
    backend_generate: Callable[[list[GenerationRequest]], list[Completion]],
    requests: list[GenerationRequest],
    on_completion: OnCompletion | None,
) -> list[Completion]:
    """`agenerate` for a backend whose `generate` returns everything at once."""
    outs = await asyncio.to_thread(backend_generate, requests)
    if on_completion is not None:
        for i, out in enumerate(outs):
            on_completion(i, out)
    return outs


def vllm_available() -> bool:
    """vLLM is installed (found without importing it: its import takes ~30 s and belongs in the worker)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver reads as no GPU
        return False


def choose_backend(requested: str) -> str:
    """'auto' -> 'vllm' when vLLM is installed and a GPU is present, else 'hf'."""
    if requested == "auto":
        return "vllm" if vllm_available() and cuda_available() else "hf"
    if requested == "vllm" and not vllm_available():
        raise BackendError("rollout.backend=vllm but vLLM is not installed: pip install 'kforge[gpu]', or set rollout.backend=hf")
    if requested == "vllm" and not cuda_available():
        raise BackendError("rollout.backend=vllm needs a CUDA GPU and none is visible; set rollout.backend=hf")
    if requested not in ("vllm", "hf"):
        raise BackendError(f"rollout.backend={requested!r} is not one of auto, vllm, hf")
    return requested


def make_backend(cfg: "KforgeConfig", devices: list[int] | None = None, **kwargs: Any) -> RolloutBackend:
    """The configured backend on `devices`: logical GPU indices as this process sees them, i.e. positions in
    CUDA_VISIBLE_DEVICES when that is set (the vLLM worker maps them to physical ids for its own
    CUDA_VISIBLE_DEVICES). None: the hf backend takes GPU 0 when there is one, the vLLM worker the GPUs
    this process sees. Extra keyword arguments go to the backend's constructor."""
    kind = choose_backend(cfg.rollout.backend)
    if kind == "vllm":
        from kforge.rollout.vllm_worker import VLLMBackend

        return VLLMBackend.from_config(cfg, devices, **kwargs)
    from kforge.rollout.hf import HFBackend

    return HFBackend.from_config(cfg, devices, **kwargs)


def sampling_from_config(cfg: "KforgeConfig", stop: list[str] | None = None, max_tokens: int | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else r.max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop=list(stop or []),
        seed=None,
    )
