"""The parent's requests that produce outputs, shared by the reference and the candidate: ask for a trial
or a timed call, then read the outputs from the child's arena while the child is frozen.

The same loop runs for the trusted reference and for every candidate, so the reference's clock measures
exactly the overhead a candidate's calls carry (inputs, flush, copy out, pipes, freezing and reading).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from kforge.evaluator import protocol as P
from kforge.evaluator.arena import Where
from kforge.evaluator.children import Child, ProtocolViolation
from kforge.evaluator.timing_check import Clock


class ChildError(Exception):
    """The child answered with an error report (kept: the stage decides what it means)."""

    def __init__(self, msg: dict[str, Any]) -> None:
        super().__init__(str(msg.get("message", ""))[:200])
        self.msg = msg


def ask(child: Child, request: dict[str, Any] | None, expect: str, deadline: float, bound: int = P.HEADROOM) -> dict[str, Any]:
    msg = child.ask(request, expect, deadline, max(bound, P.HEADROOM))
    if msg["type"] == P.ERROR:
        raise ChildError(msg)
    return msg


def trial(child: Child, k: int, seed: int, signed: bool, meta: list[Any] | None, slots: list[Any] | None,
          where: Where, deadline: float, ablate: bool = False,
          check: Callable[[Any, list[Any]], str] | None = None) -> tuple[dict[str, Any], list[Any] | str]:
    """One trial: the answer, and the outputs the parent read (or, as text, why it read none: `check`
    compares the answer's meta with the expected one first; no slots means nothing is read)."""
    req = {"op": P.OP_TRIAL, "id": k, "seed": seed, "signed": signed, "ablate": ablate,
           "slots": slots, "size": child.arena.size if child.arena is not None else 0}
    ans = ask(child, req, P.TRIAL, deadline)
    if slots is None or meta is None:
        return ans, "not read"
    why = check(ans.get("meta"), meta) if check is not None else ""
    if why:
        return ans, why
    plain = ans.get("plain") if isinstance(ans.get("plain"), list) else []
    return ans, child.read(meta, slots, where, plain)


def timed_calls(child: Child, seeds: list[int], meta: list[Any], slots: list[Any], positions: list[list[Any]],
                deadline: float, profile_at: int | None = None,
                answers: list[dict[str, Any]] | None = None,
                phases: dict[str, float] | None = None,
                budget: tuple[float, int] | None = None) -> tuple[Clock, list[list[Any]]]:
    """One `time` request per call on the parent's seeds; the parent's clock runs from each request to the
    end of reading that call's outputs, so work the child moves out of its own window, skips and redoes
    when copying out, or defers, is counted, and it notes when the child said its window ended (before the
    copy-out). Returns the clock and, per call, the values at that call's own `positions`; each answer
    (launch evidence, coverage) goes to `answers`. Call `profile_at` runs under the profiler: its outputs
    are read and checked like any other's, its time is left out of the clock. `phases` (when given) adds up
    the seconds of the calls' parts: up to the window's end, the child's copy-out and answer, the parent's
    frozen read (what `bench/judge_latency.py` prints). `budget` (seconds, calls): stop once the calls took
    that long and at least that many were made; the values returned are the calls made."""
    clock = Clock([], [], [])
    samples: list[list[Any]] = []
    size = child.arena.size if child.arena is not None else 0
    started = time.perf_counter()
    for i, (seed, where) in enumerate(zip(seeds, positions, strict=True)):
        if budget is not None and i >= budget[1] and time.perf_counter() - started >= budget[0]:
            break
        profiled = i == profile_at
        t0 = time.perf_counter()
        ask(child, {"op": P.OP_TIME, "seed": seed, "slots": slots, "size": size, "profile": profiled}, P.WINDOW,
            deadline)
        t1 = time.perf_counter()
        timed = ask(child, None, P.TIMED, deadline)
        t_answer = time.perf_counter()
        plain = timed.get("plain") if isinstance(timed.get("plain"), list) else []
        samples.append(child.read(meta, slots, where, plain))
        t2 = time.perf_counter()
        if phases is not None:
            for part, s in (("window", t1 - t0), ("answer", t_answer - t1), ("read", t2 - t_answer)):
                phases[part] = phases.get(part, 0.0) + s
        if answers is not None:
            answers.append(timed)
        if profiled:
            continue
        reported = timed.get("ms")
        if isinstance(reported, bool) or not isinstance(reported, (int, float)):
            raise ProtocolViolation("a timed call without its time")
        clock.wall_ms.append((t2 - t0) * 1e3)
        clock.window_ms.append((t1 - t0) * 1e3)
        clock.reported_ms.append(float(reported))
    return clock, samples
