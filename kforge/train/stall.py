"""Watching a stage of a training step: say which stage is stuck and what it waits for.

Every wait inside a stage has its own deadline (engine calls, verdicts, learner calls); this makes a slow
stage visible long before one of them ends it. Progress is the rollout runner's count of finished turns."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, TypeVar

log = logging.getLogger("kforge.train")
T = TypeVar("T")


async def cancel(task: "asyncio.Future | None") -> None:
    """Cancel a task and wait for it to end (its exception, if any, is dropped)."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def watched(stage_work: Awaitable[T], message_head: str, every: float, progress: Callable[[], int],
                  waiting_for: Callable[[], str], warn: Callable[[str], None]) -> T:
    """Await `stage_work`; whenever `progress()` has not moved for `every` seconds, log and `warn` a line
    starting with `message_head` that says for how long and what the stage waits for."""
    task = asyncio.ensure_future(stage_work)
    seen, since = progress(), time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            if progress() != seen:
                seen, since = progress(), time.monotonic()
                continue
            message = f"{message_head} has not moved for {time.monotonic() - since:.0f} s; waiting for {waiting_for()}"
            log.warning(message)
            warn(message)
    except BaseException:
        await cancel(task)
        raise
