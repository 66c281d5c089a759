"""Data-parallel rollout: one engine per rollout GPU (or per tensor-parallel group), behind one backend.

A model that fits one GPU is served by one engine per GPU, not by one engine split over them all (tensor
parallel pays an all-reduce per layer and scales far below the GPU count). The router sends every request of
a route (a problem: its group of trajectories, all turns) to one replica, so the replica's prefix cache holds
the problem's prompt for the whole group; a new route goes to the replica with the fewest routes. Adapter
syncs, sleep and wake go to every replica; each completion keeps the adapter version its replica sampled with.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
from typing import Any

from kforge.rollout.base import Completion, GenerationRequest, OnCompletion


class Replicas:
    concurrent = True

    def __init__(self, replicas: list[Any]) -> None:
        if not replicas:
            raise ValueError("data-parallel rollout needs at least one engine")
        self.replicas = replicas
        self.tokenizer = replicas[0].tokenizer
        self.adapter_dtype = getattr(replicas[0], "adapter_dtype", None)  # the adapter copies' (EngineCopies)
        self._routes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._fan = cf.ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix="kforge-replica")

    @property
    def version(self) -> int:
        return min(int(getattr(r, "version", 0)) for r in self.replicas)

    def replica_of(self, route: str) -> int:
        """The replica a route is pinned to; a new route takes the replica holding the fewest."""
        with self._lock:
            if route not in self._routes:
                load = [0] * len(self.replicas)
                for i in self._routes.values():
                    load[i] += 1
                self._routes[route] = min(range(len(load)), key=lambda i: (load[i], i))
            return self._routes[route]

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return asyncio.run(self.agenerate(requests)) if requests else []

    async def agenerate(self, requests: list[GenerationRequest],
                        on_completion: OnCompletion | None = None) -> list[Completion]:
        parts: dict[int, list[int]] = {}
        for i, r in enumerate(requests):
            parts.setdefault(self.replica_of(r.route), []).append(i)

        async def on(replica: int, positions: list[int]) -> list[Completion]:
            done = (lambda k, c: on_completion(positions[k], c)) if on_completion is not None else None
            return await self.replicas[replica].agenerate([requests[i] for i in positions], done)

        out: list[Any] = [None] * len(requests)
        results = await asyncio.gather(*(on(rep, pos) for rep, pos in parts.items()))
        for (rep, positions), completions in zip(parts.items(), results):
            for i, c in zip(positions, completions):
                out[i] = c
        return out

    def _every(self, method: str, *args: Any) -> None:
        """The call on every replica at once (an adapter load takes seconds per engine); the first error raises."""
        for fut in [self._fan.submit(getattr(r, method), *args) for r in self.replicas]:
            fut.result()

    def load_adapter(self, path: str, version: int) -> None:
        self._every("load_adapter", path, version)

    def sleep(self) -> None:
        self._every("sleep")

    def wake(self) -> None:
        self._every("wake")

    def close(self) -> None:
        for r in self.replicas:
            r.close()
        self._fan.shutdown(wait=False)
