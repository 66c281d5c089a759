"""Requests from many trajectories, handed to the engine as they come: no turn barrier.

A trajectory asks for its next completion as soon as its own verdict is back. An engine that schedules
requests itself (`backend.concurrent`, vLLM) gets each request at once; an engine that takes one call at
a time (hf) gets, whenever it is free, one batch of every request that is waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from kforge.rollout.base import Completion, GenerationRequest, RolloutBackend


class GenerationQueue:
    def __init__(self, backend: RolloutBackend) -> None:
        self.backend = backend
        self._waiting: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._drain: asyncio.Task | None = None
        self.batches: list[int] = []  # size of each call made to a one-call-at-a-time engine

    async def generate(self, request: GenerationRequest) -> Completion:
        if self.backend.concurrent:
            (completion,) = await self.backend.agenerate([request])
            return completion
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiting.append((request, fut))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.ensure_future(self._run())
        return await fut

    async def _run(self) -> None:
        while self._waiting:
            await asyncio.sleep(0)  # trajectories that became ready in this loop turn join the batch
            batch, self._waiting = self._waiting, []
            self.batches.append(len(batch))

            # `batch` bound now: a completion reported late (after this call ended or raised) must reach
            # its own trajectory, not the one at its index in the next batch.
            def done(i: int, completion: Completion, batch: list = batch) -> None:
                if not batch[i][1].done():
                    batch[i][1].set_result(completion)

            try:
                outs = await self.backend.agenerate([req for req, _ in batch], done)
            except BaseException as exc:  # every waiting trajectory sees the engine's failure
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, fut), completion in zip(batch, outs):
                if not fut.done():
                    fut.set_result(completion)


class EngineGate:
    """Engine calls pass while it is open; `close()` shuts it and returns once no call is in flight (continuous
    rollouts on GPUs the learner shares: nothing may generate while the engines sleep)."""

    def __init__(self) -> None:
        self.calls = 0  # engine calls that passed and have not returned
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def passage(self) -> AsyncIterator[None]:
        while not self._open.is_set():  # checked again on waking: it may have closed since it was opened
            await self._open.wait()
        self.calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.calls -= 1
            if self.calls == 0:
                self._idle.set()

    async def close(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def open(self) -> None:
        self._open.set()
