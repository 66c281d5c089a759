"""A stand-in for vLLM's async engine inside the real vLLM worker process (this machine has neither vLLM nor a
GPU): `RecordingEngine` implements VLLMEngine's methods and records what it was asked to do. The worker imports
it by the name in ENGINE; the rollout tests start the real worker with it."""

from __future__ import annotations

import asyncio
import os
import time

from kforge.rollout.base import GenerationRequest, SamplingParams

# What VLLMBackend(engine=...) imports in its worker process.
ENGINE = "recording_engine:RecordingEngine"


class EngineDeadError(RuntimeError):
    """Named as vLLM's: its engine core died, and the worker process lives on."""


class RecordingEngine:
    """Implements VLLMEngine's methods in the worker and records what it was asked to do."""

    def __init__(self, fail: bool = False, **kwargs):
        if fail:
            raise RuntimeError("engine could not start: no GPU memory left")
        self.kwargs = kwargs
        self.env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "VLLM_USE_FLASHINFER_SAMPLER")}
        self.loaded: list[tuple[str, int, str]] = []
        self.removed: list[int] = []
        self.resets = 0
        self.asleep = False
        self.events: list[str] = []

    async def generate(self, request, lora):
        if self.asleep:
            raise RuntimeError("generate while asleep")
        r = request
        if r["prompt_ids"] == [666]:
            os._exit(3)  # a hard crash of the worker
        if r["prompt_ids"] == [667]:
            raise EngineDeadError("EngineCore encountered an issue. See stack trace (above) for the root cause.")
        if r["prompt_ids"][0] == 500:  # a slow request: others must not wait for it
            await asyncio.sleep(0.5)
        self.events.append(f"gen{r['prompt_ids'][0]}")
        n = min(r["sampling"]["max_tokens"], len(r["prompt_ids"]))
        ids = list(reversed(r["prompt_ids"]))[:n]
        tag = "base" if lora is None else f"lora{lora[1]}"
        return {"token_ids": ids, "text": f"{tag}:{ids}", "logprobs": [-0.25] * n,
                "finish_reason": "length" if n == r["sampling"]["max_tokens"] else "stop"}

    def load_lora(self, lora):
        if "slow-load" in lora[2]:
            time.sleep(0.4)
        self.loaded.append(tuple(lora))
        self.events.append(f"load{lora[1]}")

    def remove_lora(self, int_id):
        self.removed.append(int_id)
        self.events.append(f"remove{int_id}")

    def reset_prefix_cache(self):
        self.resets += 1
        self.events.append("reset")

    def sleep(self, level=1):
        self.asleep = True

    def wake(self):
        self.asleep = False

    def state(self):
        return {"kwargs": self.kwargs, "env": self.env, "loaded": self.loaded, "removed": self.removed,
                "resets": self.resets, "events": self.events}


class Tok:
    """The parent side needs a tokenizer only to hand it to the prompt builder."""


def req(ids, max_tokens=3, **kw):
    return GenerationRequest(ids, SamplingParams(max_tokens=max_tokens, **kw))
