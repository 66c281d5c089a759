"""The vLLM backend: an async vLLM engine in its own process on its own GPU set, served by `kforge.served`.

Why a process: vLLM must see only the rollout GPUs (CUDA_VISIBLE_DEVICES is set before torch or vLLM
initialise CUDA there), its import and CUDA state must not leak into the trainer, and a crash there must
not take the run down with it. `kforge.served` gives the ready handshake, liveness checks, the child's
last words on a crash and an ordered close (the same machinery runs the learner process).

No turn barrier: the engine is vLLM's async engine and every request is its own call, several in flight
at once; the engine batches them itself, so a trajectory whose verdict came back gets its next turn
generated while others are still being sampled or evaluated.

Weight sync: every `load_adapter` registers the PEFT folder under a new integer LoRA id and name (never
reused: vLLM caches adapters by id, and its prefix-cache block hashes include the LoRA name (id in older
versions), so no request of the new adapter can hit a block computed with older weights; the prefix cache
is not reset on a sync, only after a wake, when the KV cache was discarded). The adapter it replaces is
removed only once no request in flight names it (pipelined steps sync while the next step's rollouts run:
`kforge.rollout.adapters`). Each completion carries the adapter version it was sampled with. Log-probs
are vLLM's `processed_logprobs` (see `kforge.rollout.base`).

`VLLMEngine` is the only code that touches vLLM; the process and the protocol speak to any object with
its methods, which is how they are tested on machines without a GPU.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib.util
import itertools
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kforge.rollout.adapters import AdapterLeases
from kforge.rollout.base import BackendDefaults, BackendError, Completion, GenerationRequest, OnCompletion
from kforge.served import ENV_LOCK, ServedError, ServedProcess

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from vllm.lora.request import LoRARequest

    from kforge.config.schema import KforgeConfig
    from kforge.modelio import ModelRef

DEFAULT_ENGINE = "kforge.rollout.vllm_worker:VLLMEngine"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# ---------------------------------------------------------------------------------------------- child side
class VLLMEngine:
    """Thin wrapper over vLLM's async engine, constructed inside the worker process (in its event loop)."""

    def __init__(self, **engine_kwargs: object) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))
        self._ids = itertools.count()

    async def generate(self, request: dict[str, Any], lora: tuple[str, int, str] | None) -> dict[str, Any]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request["sampling"]
        kwargs: dict[str, Any] = dict(
            # Only the finished completion: the default streams a cumulative copy of the tokens and
            # log-probs so far at every engine step, quadratic in the length (0.77x the engine's own
            # rate at 256 x 512 tokens on an H100, where `LLM.generate` asks for the final output only).
            output_kind=RequestOutputKind.FINAL_ONLY,
            n=1,
            max_tokens=s["max_tokens"],
            temperature=s["temperature"],
            top_p=s["top_p"],
            seed=s["seed"],
            logprobs=0,  # the sampled token's log-prob only
            include_stop_str_in_output=True,  # text stays the decode of token_ids
            skip_special_tokens=True,
        )
        if s["top_k"] and s["top_k"] > 0:  # "off" is spelled differently across vLLM versions: omit it
            kwargs["top_k"] = s["top_k"]
        if s["stop"]:
            kwargs["stop"] = list(s["stop"])
        final = None
        async for out in self.engine.generate({"prompt_token_ids": request["prompt_ids"]}, VSamplingParams(**kwargs),
                                              f"kforge-{next(self._ids)}", lora_request=self._lora_request(lora)):
            final = out
        if final is None:
            raise BackendError("vLLM returned no output for a request")
        o = final.outputs[0]
        token_ids = list(o.token_ids)
        return {"token_ids": token_ids, "text": o.text, "logprobs": sampled_logprobs_of(token_ids, o.logprobs),
                "finish_reason": "length" if o.finish_reason == "length" else "stop"}

    @staticmethod
    def _lora_request(lora: tuple[str, int, str] | None) -> LoRARequest | None:
        if lora is None:
            return None
        from vllm.lora.request import LoRARequest

        name, int_id, path = lora
        return LoRARequest(name, int_id, path)

    async def load_lora(self, lora: tuple[str, int, str]) -> None:
        """Load now, so that a bad adapter fails here and not in the next rollout."""
        await self.engine.add_lora(self._lora_request(lora))

    async def remove_lora(self, int_id: int) -> None:
        try:
            await self.engine.remove_lora(int_id)
        except Exception:  # already evicted from the engine's LRU: nothing to free
            pass

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def sleep(self, level: int = 1) -> None:
        await self.engine.sleep(level)

    async def wake(self) -> None:
        await self.engine.wake_up()
        await self.engine.reset_prefix_cache()  # the KV cache was discarded while asleep

    def close(self) -> None:
        self.engine.shutdown()


def sampled_logprobs_of(token_ids: list[int], logprobs: Sequence[Mapping[int, object]] | None) -> list[float]:
    """The sampled tokens' log-probs from a vLLM CompletionOutput.logprobs (a list with one {token id:
    Logprob} mapping per position; with logprobs=0 each holds just the sampled token)."""
    if logprobs is None:
        raise BackendError("vLLM returned no log-probs (SamplingParams.logprobs was not honoured)")
    out = []
    for i, token in enumerate(token_ids):
        entry = logprobs[i][token]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


# --------------------------------------------------------------------------------------------- parent side
def lora_rank_for(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank`."""
    try:
        from typing import get_args

        from vllm.config.lora import MaxLoRARanks  # type: ignore[import-not-found]

        ranks = sorted(get_args(MaxLoRARanks)) or list(LORA_RANKS)
    except Exception:
        ranks = list(LORA_RANKS)
    for r in ranks:
        if rank <= r:
            return r
    raise BackendError(f"lora.rank={rank} is above vLLM's largest max_lora_rank {ranks[-1]}")


def engine_kwargs_from_config(cfg: KforgeConfig, devices: list[int] | None, ref: "ModelRef") -> dict[str, Any]:
    """The engine's arguments for the model `ref` (the config's model, resolved by the caller)."""
    model = str(Path(ref.path) / ref.gguf_file) if ref.gguf_file else ref.path
    kwargs: dict[str, Any] = dict(
        model=model,
        tokenizer=ref.path,
        dtype=cfg.model.dtype,
        max_model_len=cfg.model.max_model_len,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        enable_prefix_caching=cfg.rollout.enable_prefix_caching,
        enforce_eager=cfg.rollout.enforce_eager,
        enable_sleep_mode=cfg.rollout.sleep_between_phases,
        enable_lora=True,
        max_lora_rank=lora_rank_for(cfg.lora.rank),
        max_loras=2,  # requests of the old and the new adapter share batches while a sync lands mid-episode
        tensor_parallel_size=max(1, len(devices)) if devices else 1,
        seed=cfg.dataset.seed,
        trust_remote_code=cfg.model.trust_remote_code,
        logprobs_mode="processed_logprobs",
    )
    return kwargs


def child_env(devices: list[int] | None) -> dict[str, str]:
    from kforge.gpus import GpuIndexError, child_visible_devices

    env = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    if devices is not None:
        try:
            # Under the lock: replicas start side by side, and a start sets its engine's CUDA_VISIBLE_DEVICES in
            # this process's environment meanwhile (a replica once read another's two GPUs as the machine's).
            with ENV_LOCK:
                env["CUDA_VISIBLE_DEVICES"] = child_visible_devices(devices)
        except GpuIndexError as exc:
            raise BackendError(f"rollout GPUs {devices}: {exc}") from None
    if importlib.util.find_spec("flashinfer") is None and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"  # vLLM's sampler otherwise imports FlashInfer
    return env


class VLLMBackend(BackendDefaults):
    """`RolloutBackend` over a vLLM engine in a worker process."""

    concurrent = True  # every request is its own call; the engine batches them

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        engine_kwargs: dict[str, Any],
        *,
        devices: list[int] | None = None,
        engine: str = DEFAULT_ENGINE,
        log_path: str | None = None,
        startup_timeout_s: float = 1200.0,
        request_timeout_s: float = 1800.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.version = 0
        self.log_path = log_path
        # The dtype the engine computes the adapter in: its copies are written in it (half the bytes of fp32).
        dtype = engine_kwargs.get("dtype")
        self.adapter_dtype = dtype if dtype in ("bfloat16", "float16") else None
        self._lora: tuple[str, int, str] | None = None
        self._next_lora_id = 1
        self._closed = False
        self._engine_dead = False  # vLLM's engine died behind this live worker: see `_error`
        self._asleep = False
        self._pending_adapter: tuple[str, int] | None = None
        self._leases = AdapterLeases()
        # The trainer syncs from a thread: reading the current adapter and leasing it must be one step
        # against a swap, or the adapter could be retired and removed between the two.
        self._swap = threading.Lock()
        self.load_times: dict[str, float] = {}  # the parts of the last adapter load, seconds (trainer metrics)
        try:
            # daemon=False: vLLM starts processes of its own, which a daemon may not.
            self._proc = ServedProcess(engine, engine_kwargs, name="vLLM worker", env={**child_env(devices), **(env or {})},
                                       log_path=log_path, start_timeout_s=startup_timeout_s,
                                       call_timeout_s=request_timeout_s, daemon=False)
        except ServedError as exc:
            raise BackendError(str(exc)) from None
        self.info = self._proc.info
        atexit.register(self.close)

    @classmethod
    def from_config(cls, cfg: KforgeConfig, devices: list[int] | None = None, ref: "ModelRef | None" = None,
                    **kwargs: object) -> "VLLMBackend":
        """The engine of `cfg` on `devices`. The model is resolved once (here, or by the caller that starts
        several engines: `ref`), and the tokenizer and the engine read that one folder."""
        from kforge.modelio import load_tokenizer, resolve_model

        if ref is None:
            ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
        tokenizer = load_tokenizer(ref, cfg.model.chat_template, cfg.model.trust_remote_code)
        engine_kwargs = engine_kwargs_from_config(cfg, devices, ref)
        engine_kwargs.update(kwargs.pop("engine_kwargs", {}))
        kwargs.setdefault("request_timeout_s", cfg.rollout.request_timeout_s)
        return cls(tokenizer, engine_kwargs, devices=devices, **kwargs)

    def _call(self, op: str, timeout_s: float | None = None, **kwargs: object) -> object:
        if self._closed:
            raise BackendError(f"vLLM backend is closed ({op})")
        try:
            return self._proc.call(op, timeout_s=timeout_s, **kwargs)
        except ServedError as exc:
            raise self._error(exc) from None

    def _error(self, exc: ServedError) -> BackendError:
        """The worker's error for the caller. vLLM's EngineDeadError means its engine core died while this
        worker lives on, and every later call fails alike: from now on the worker counts as dead (`alive`), so
        it is restarted as one whose process died, not taken for one request's own error."""
        if "EngineDeadError" in str(exc):
            self._engine_dead = True
        return BackendError(str(exc))

    # ------------------------------------------------------------------ RolloutBackend
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return asyncio.run(self.agenerate(requests)) if requests else []

    async def agenerate(
        self, requests: list[GenerationRequest], on_completion: OnCompletion | None = None
    ) -> list[Completion]:
        if self._closed:
            raise BackendError("vLLM backend is closed (generate)")
        with self._swap:
            lora, version = self._lora, self.version  # the adapter these requests are sampled with
            for _ in requests if lora is not None else ():
                self._leases.acquire(lora[1])

        async def one(i: int, r: GenerationRequest) -> Completion:
            sampling = {**r.sampling.__dict__, "stop": list(r.sampling.stop)}
            try:
                out = await self._proc.acall("generate", request={"prompt_ids": list(r.prompt_ids), "sampling": sampling},
                                             lora=lora)
            except ServedError as exc:
                raise self._error(exc) from None
            finally:
                if lora is not None and self._leases.release(lora[1]) and not self._closed:
                    try:  # the last request of a replaced adapter: the engine may free it now
                        await self._proc.acall("remove_lora", int_id=lora[1])
                    except ServedError:
                        pass  # a dead worker holds nothing; its own error reaches the caller
            completion = Completion(**out, policy_version=version)
            if on_completion is not None:
                on_completion(i, completion)
            return completion

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(requests))))

    def load_adapter(self, path: str, version: int) -> None:
        """Register the adapter under a fresh id; while asleep the load waits for `wake()` (loading needs
        the engine's GPU memory)."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"vLLM backend: {path} is not a PEFT adapter folder (no adapter_config.json)")
        if self._asleep:
            self._pending_adapter = (path, version)
            return
        lora = (f"kforge-v{version}-{self._next_lora_id}", self._next_lora_id, str(Path(path).resolve()))
        self._next_lora_id += 1  # never reused, even for a reload of the same version
        t0 = time.perf_counter()
        self._call("load_lora", lora=lora)  # the engine reads the folder and moves the weights to its GPU
        t1 = time.perf_counter()
        with self._swap:
            previous, self._lora = self._lora, lora
            self.version = version
            unused = previous is not None and self._leases.retire(previous[1])  # else its last request removes it
        # No prefix-cache reset: blocks are keyed by the adapter, and this adapter's name is new (above).
        if unused:
            self._call("remove_lora", int_id=previous[1])
        self.load_times = {"sync_engine_load_s": t1 - t0, "sync_remove_s": time.perf_counter() - t1}

    def sleep(self) -> None:
        if not self._asleep:
            self._call("sleep", level=1)  # level 2 with LoRA has crashed upstream; level 1 keeps weights in RAM
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._call("wake")
            self._asleep = False
        if self._pending_adapter is not None:
            path, version = self._pending_adapter
            self._pending_adapter = None
            self.load_adapter(path, version)

    def alive(self) -> bool:
        """The worker process runs and answers (one that let a call pass its deadline counts as dead)."""
        return not self._closed and not self._engine_dead and self._proc.alive()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._proc.close(timeout_s=60)
