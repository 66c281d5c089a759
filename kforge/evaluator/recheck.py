"""A second look before a timing flag: the candidate's timed calls again, each paired with a call of a
fresh trusted reference child on the same inputs, in the same moment.

The first check compares the candidate's clock with the reference's, measured once per problem and cached:
measured on an idle machine and compared with a candidate timed under load (another pool beside it, a busy
CI machine), an honest kernel's least wall time per call exceeds the reference's by more than any slack, and
it was flagged `timing_inconsistent` (3 % of honest kernels on an H200 beside a second pool; CI on a busy
2-core machine). Load falls on both sides of a pair alike, so the flag is kept only when the candidate still
disagrees with its twin call by call (timing_check.recheck_timing). Each pair's inputs are fresh and the candidate's
outputs are compared with its twin's at positions nobody else knows: the re-measured calls are checked like
every other timed call, their launch evidence included (a pause while the twin starts tells the candidate it
is re-measured: outputs PyTorch finished only then are judged as in any call, timing_stage._recheck). A twin
that cannot run (out of memory beside a big candidate) changes nothing.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kforge.evaluator import drive
from kforge.evaluator import protocol as P
from kforge.evaluator.arena import Where
from kforge.evaluator.children import Child
from kforge.evaluator.context import PoolContext
from kforge.evaluator.judge import sample_positions
from kforge.evaluator.reference import await_ready, fresh_seeds, start_reference
from kforge.evaluator.slot import Slot
from kforge.evaluator.timing_check import Clock

GPU_PAIRS, CPU_PAIRS = 16, 5  # enough calls for a median that one delayed call cannot move


class TwinFailed(Exception):
    """The trusted twin could not be started or timed: the first check's finding stands."""


def _merge(into: Clock, one: Clock) -> None:
    into.wall_ms += one.wall_ms
    into.window_ms += one.window_ms
    into.reported_ms += one.reported_ms


class Twin:
    """A trusted reference child of the problem, ready for timed calls (with the same weights as the
    candidate's model: `init_seed`)."""

    def __init__(self, ctx: PoolContext, slot: Slot, problem_code: str, init_seed: int, arena_bytes: int,
                 warmup: int) -> None:
        self.child: Child = start_reference(ctx, slot, problem_code, init_seed)
        try:
            await_ready(self.child, ctx.cfg.compile_timeout_s)
            assert self.child.arena is not None
            self.child.arena.grow(arena_bytes)
            deadline = time.monotonic() + ctx.cfg.run_timeout_s
            drive.ask(self.child, {"op": P.OP_WARMUP, "seeds": fresh_seeds(warmup)}, P.WARM, deadline)
        except Exception as exc:  # noqa: BLE001 - whatever stops the trusted side: keep the first finding
            self.child.close()
            raise TwinFailed(str(exc)[:200]) from None

    def call(self, seed: int, meta: list[Any], slots: list[Any], where: Where, deadline: float) -> tuple[Clock, list[Any]]:
        try:
            clock, got = drive.timed_calls(self.child, [seed], meta, slots, [where], deadline)
        except Exception as exc:  # noqa: BLE001 - as above
            raise TwinFailed(str(exc)[:200]) from None
        return clock, got[0]

    def close(self) -> None:
        self.child.send({"op": P.OP_BYE})
        self.child.close()


def paired_calls(ctx: PoolContext, slot: Slot, child: Child, problem_code: str, init_seed: int, meta: list[Any],
                 slots: list[Any], arena_bytes: int,
                 answers: list[dict[str, Any]]) -> tuple[Clock, Clock, list[list[Any]], list[list[Any]]]:
    """The candidate's clock and its twin's over the same fresh inputs, one pair at a time (which side goes
    first alternates, so a drifting load favours neither), and the values each read at the same positions.
    Candidate failures (an error, a hang, a death) propagate as in any timed call; the twin's are TwinFailed."""
    cfg = ctx.cfg
    twin = Twin(ctx, slot, problem_code, init_seed, arena_bytes, max(cfg.warmup_trials, 1))
    try:
        gen = torch.Generator().manual_seed(fresh_seeds(1)[0])
        deadline = time.monotonic() + cfg.timing_timeout_s
        mine, theirs = Clock([], [], []), Clock([], [], [])
        got, want = [], []
        for i, seed in enumerate(fresh_seeds(GPU_PAIRS if slot.on_gpu else CPU_PAIRS)):
            where = sample_positions(meta, cfg.sample_points, gen)
            if i % 2:
                c_clock, c_got = drive.timed_calls(child, [seed], meta, slots, [where], deadline, answers=answers)
            t_clock, t_got = twin.call(seed, meta, slots, where, deadline)
            if not i % 2:
                c_clock, c_got = drive.timed_calls(child, [seed], meta, slots, [where], deadline, answers=answers)
            _merge(mine, c_clock)
            _merge(theirs, t_clock)
            got.append(c_got[0])
            want.append(t_got)
        return mine, theirs, got, want
    finally:
        twin.close()
