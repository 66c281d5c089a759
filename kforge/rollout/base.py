"""The one interface every generation backend implements (the factory that picks one is `factory.py`).

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
    seed: int | None = None  # per request: its tokens do not depend on the other requests of a batch

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def key(self) -> tuple[int, float, float, int, tuple[str, ...]]:
        """Requests with equal keys can share one batched call of an engine that takes one setting."""
        return (self.max_tokens, self.temperature, self.top_p, self.top_k, tuple(self.stop))


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    route: str = ""  # requests with one route go to one engine replica (a problem's group: its prefix cache)


@dataclass
class Completion:
    token_ids: list[int]  # sampled tokens, the final EOS included when one was sampled
    text: str  # decode(token_ids) without special tokens; a matched stop string stays in the text
    logprobs: list[float]  # one per token id, see the convention above
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    policy_version: int | None = None  # adapter version the engine sampled with (None: not known)


OnCompletion = Callable[[int, Completion], None]


@runtime_checkable
class RolloutBackend(Protocol):
    tokenizer: PreTrainedTokenizerBase
    # True: the engine schedules requests itself, so `agenerate` may be called again while earlier calls
    # run (vLLM takes requests one by one). False: one call at a time; callers batch what is ready.
    concurrent: bool
    adapter_dtype: str | None  # the dtype the engine loads adapters in (EngineCopies writes it); None: as saved
    restarts: int  # engines the backend started again on its own after a failure (a router of replicas)
    load_times: Mapping[str, float]  # the parts of the last adapter load, seconds (a step's metrics)
    version: int | None  # the adapter version it samples with now (None: it does not say)

    def wait_restarts(self, timeout_s: float | None = None) -> bool:
        """Until no engine of it is starting again (the learner must not share a GPU with a start); False if
        one still is after `timeout_s`."""
        ...

    def alive(self) -> bool | None:
        """Whether its engine still runs (False: its worker is gone and a restart is due; None: it cannot
        tell, and an error it raises is taken as the error of the call)."""
        ...

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


class BackendDefaults:
    """What a backend without a feature answers for it: the optional part of RolloutBackend, declared once
    (every backend and test double derives from this instead of each caller guessing with getattr)."""

    concurrent: bool = False
    adapter_dtype: str | None = None
    restarts: int = 0
    load_times: Mapping[str, float] = MappingProxyType({})
    version: int | None = None

    def wait_restarts(self, timeout_s: float | None = None) -> bool:
        return True

    def alive(self) -> bool | None:
        return None


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
