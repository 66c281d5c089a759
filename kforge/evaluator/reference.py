"""The reference side of every comparison, computed once per problem and device and cached.

A trusted child (it runs the problem's Model, never candidate code) is driven through the same
protocol and the same loop (drive.py) as a candidate: outputs for the correctness trials, the timed
calls on the timing seeds, whose values at secret positions become what every candidate's timed calls
must match and whose parent-side clock says what the loop itself costs per call, and the decoy trial.
On a GPU its event times are the eager (and optionally torch.compile) baseline.

The cache lives in kforge's cache folder, which no child can read: reference outputs never reach
a candidate's process. A failed reference is never kept for good (a GPU out of memory while the learner
peaks would drop its problem from training for the rest of the run): it is answered from memory until its
back-off ends (`evaluator.reference_retry_s`, doubling per failure up to 64x), then computed again.

Inputs are drawn by the parent, fresh: the trial, decoy and timing seeds of a draw come from the
system's random source, and a draw serves `evaluator.inputs_reuse` evaluations of a problem (1: each its
own). When one seed plan served every candidate, one evaluation could publish (input, output) pairs and
a later one replay them. What does not depend on the inputs' values (the model's weights, the outputs'
layout, the loop's clock, the baseline's times) is measured once and cached; a new draw is one more run
of the reference on the new inputs, without the timing. A draw computes the reference's values for
`DRAW_CHECKED_CALLS` of its timed calls, picked at random, not for all of them: running the reference on
every timing input made a draw cost as much as the candidate's timing (the pool's throughput fell by a
quarter on an H200). Every timed call still gets fresh inputs and has its outputs read; which calls are
compared is revealed to nobody, so a candidate that answers c of N calls wrongly is caught unless all of the
checked calls miss them: (1 - c/N)^16, 19 % for a tenth of the calls, under 0.002 % for half.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kforge.evaluator import drive
from kforge.evaluator import protocol as P
from kforge.evaluator.arena import Arena, layout
from kforge.evaluator.children import Child, ProtocolViolation
from kforge.evaluator.context import PoolContext, sha
from kforge.evaluator.feedback import clean_error
from kforge.evaluator.judge import compare_positions, meta_bytes, sample_positions
from kforge.evaluator.slot import Slot
from kforge.evaluator.timing_check import Clock
from kforge.problems.record import Problem

TRUSTED_BOUND = 1 << 40  # the reference child runs no candidate code: its answers are not size-capped
FORMAT = 5  # bump when the cached Reference record changes
MIN_TIMED_CALLS = 5  # however big the outputs
DRAW_CHECKED_CALLS = 16  # timed calls of a draw whose outputs are compared (the timed reference run: all)
BUDGET_MIN_CALLS = 20  # a candidate's timed calls before its time budget may stop them


@dataclass
class Reference:
    trials: list[tuple[int, bool]]  # (seed, signed) of the correctness trials
    outputs: list[list[Any]]  # the reference outputs of each trial
    state: dict[str, Any]  # initial weights, copied into ModelNew
    timing_seeds: list[int]
    # Per timing seed, per output: the flat positions the parent reads in that call. New ones per call: a
    # child that somehow saw which values one call's read touched (a cache side channel on the shared
    # memory) learns nothing about the next call's.
    positions: list[list[Any]]
    samples: list[list[Any] | None]  # per timing seed: the reference values at its positions (None: not checked)
    clock: Clock | None = None
    meta: list[Any] = field(default_factory=list)  # [shape, dtype] per output (None: a plain value)
    # Per trial (the decoy last): where large outputs are compared, new for each; None: whole outputs.
    trial_positions: list[Any] | None = None
    init_seed: int = 0  # seeds the model's construction; never a trial's seed
    decoy: tuple[int, bool] | None = None  # the decoy trial (run without the candidate's kernels)
    decoy_output: list[Any] = field(default_factory=list)
    baseline_ms: dict[str, list[float]] = field(default_factory=dict)
    gpu: str = "cpu"
    error: str = ""
    contended: list[str] = field(default_factory=list)  # roles that shared the device while it was timed

    @property
    def slots(self) -> list[Any]:
        return layout(self.meta)[0]

    @property
    def arena_bytes(self) -> int:
        return layout(self.meta)[1]


def _seeds(salt: str, key: str, purpose: str, n: int) -> list[int]:
    return [int(sha(salt, key, purpose, str(i))[:15], 16) for i in range(n)]


def _finite(outputs: list[Any]) -> bool:
    return all(not isinstance(o, torch.Tensor) or not o.is_floating_point() or bool(torch.isfinite(o).all())
               for o in outputs)


def fresh_seeds(n: int) -> list[int]:
    """Seeds for calls whose outputs nobody checks (warm-up, profile): new every time, so no input repeats."""
    rng = random.SystemRandom()
    return [rng.getrandbits(60) for _ in range(n)]


def timed_call_count(calls: int, meta: list[Any], output_gb: float) -> int:
    """Every timed call's outputs are copied out for the parent to read: big outputs get fewer calls."""
    fit = int(output_gb * (1 << 30)) // max(meta_bytes(meta), 1)
    return max(min(calls, MIN_TIMED_CALLS), min(calls, fit))


class ReferenceCache:
    """Reference results per (problem, trial plan, device), in memory and on disk."""

    def __init__(self, ctx: PoolContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.clock = clock
        self._mem: dict[tuple[str, str], Reference] = {}
        self._retry: dict[tuple[str, str], tuple[float, int]] = {}  # failed: (retry at, failures so far)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self._draws: dict[tuple[str, str], tuple[Reference, int]] = {}  # the current draw and its uses

    def get(self, slot: Slot, problem: Problem, baselines: tuple[str, ...] = ()) -> Reference:
        """The reference for one evaluation: the cached timing and layout with a draw of inputs that at
        most `evaluator.inputs_reuse` evaluations share."""
        ref, key, fresh = self.timed(slot, problem, baselines)
        return ref if ref.error else self.draw(slot, problem, ref, key, fresh)

    def draw(self, slot: Slot, problem: Problem, ref: Reference, key: tuple[str, str], fresh: bool) -> Reference:
        """`ref` (what `timed` gave) with the inputs of the current draw, or of a new one when the current
        one has served `evaluator.inputs_reuse` evaluations (a run of the reference on them, not timed)."""
        with self._lock:
            draw, uses = self._draws.get(key, (ref, self.ctx.cfg.inputs_reuse)) if not fresh else (ref, 0)
            if uses < self.ctx.cfg.inputs_reuse:
                self._draws[key] = (draw, uses + 1)
                return draw
        calls = len(ref.timing_seeds)
        draw = self._compute(slot, problem, key[0], calls, [], timed=False, init_seed=ref.init_seed)
        if draw.error:
            return draw
        inputs = {f: getattr(draw, f) for f in _DRAWN}
        draw = dataclasses.replace(ref, **inputs)
        with self._lock:
            self._draws[key] = (draw, 1)
        return draw

    def timed(self, slot: Slot, problem: Problem, baselines: tuple[str, ...]) -> tuple[Reference, tuple[str, str], bool]:
        """The reference with its timing, per (problem, plan, device), from memory, disk or a run now; and
        whether it was run now (its inputs then are a fresh draw no evaluation has used)."""
        cfg = self.ctx.cfg
        calls = cfg.timing_trials if slot.on_gpu else cfg.cpu_timing_calls
        baselines = baselines if slot.on_gpu else ()
        plan = (f"v{FORMAT}|{cfg.num_correct_trials}|{calls}|{cfg.sample_points}|{cfg.warmup_trials}"
                f"|{cfg.full_compare_mb}|{cfg.compare_points}|{cfg.timing_output_gb}")
        key = (sha(problem.code, plan), slot.tag)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            ref = self._mem.get(key)
            if ref is not None and (ref.error or ref.contended) and self.clock() >= self._retry[key][0]:
                ref = None  # its back-off is over: try again (a contended one never went to disk)
            disk = self.ctx.cache_dir / "reference" / f"{key[0]}-{sha(key[1])}.pt"
            if ref is None and disk.exists():
                try:
                    ref = Reference(**torch.load(disk, weights_only=True))
                    ref.clock = Clock(**ref.clock) if isinstance(ref.clock, dict) else ref.clock
                    ref.decoy = tuple(ref.decoy) if ref.decoy else None  # type: ignore[assignment]
                except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed
                    ref = None
            missing = [b for b in baselines if b not in (ref.baseline_ms if ref else {})]
            fresh = ref is None or bool(missing and not ref.error)
            if fresh:
                ref = self._compute(slot, problem, key[0], calls, missing or list(baselines))
                if ref.error or ref.contended:  # a baseline timed beside other work is kept only until then too
                    failures = self._retry.get(key, (0.0, 0))[1] + 1
                    self._retry[key] = (self.clock() + cfg.reference_retry_s * 2 ** min(failures - 1, 6), failures)
                else:
                    self._retry.pop(key, None)
                    disk.parent.mkdir(parents=True, exist_ok=True)
                    data = dict(ref.__dict__)
                    data["clock"] = ref.clock.__dict__ if ref.clock else None
                    tmp = disk.with_suffix(f".{threading.get_ident()}.tmp")
                    torch.save(data, tmp)
                    tmp.replace(disk)
            self._mem[key] = ref
            return ref, key, fresh

    def _compute(self, slot: Slot, problem: Problem, key: str, calls: int, baselines: list[str],
                 timed: bool = True, init_seed: int | None = None) -> Reference:
        """One run of the reference on a fresh draw of inputs; with `timed`, also its clock and baselines
        (then `calls` is the plan's count of timed calls; without, the count the timed run settled on)."""
        cfg = self.ctx.cfg
        trial_seeds = fresh_seeds(cfg.num_correct_trials + 1)
        decoy_seed = fresh_seeds(1)[0]
        if init_seed is None:  # the weights: the same for every draw (candidates are given them)
            init_seed = _seeds(self.ctx.salt(), key, "init", 1)[0]
        # The GPU's gate (gate.py): the start-up (the child begins it at fork, unasked), the trials and a
        # draw's calls share it with the pool's other GPU work; the timed calls below have it alone, so
        # the shared hold ends before they ask.
        # A start-up slot (Slot.starting) before the gate, ended at READY.
        child, starting, shared = slot.start_up(lambda: start_reference(self.ctx, slot, problem.code, init_seed))
        failed = Reference([], [], {}, [], [], [])
        try:
            with starting:
                ready = await_ready(child, cfg.compile_timeout_s)
            deadline = time.monotonic() + cfg.run_timeout_s
            # A first run tells the outputs' shapes, hence the arena's layout; nothing is read from it.
            probe, _ = drive.trial(child, -1, trial_seeds[0], False, None, None, P.ALL, deadline)
            meta, unit = list(probe["meta"]), bool(probe.get("unit"))
            slots, size = layout(meta)
            child.arena.grow(size)
            gen = torch.Generator().manual_seed(fresh_seeds(1)[0])
            plan = [(s, False) for s in trial_seeds[:-1]] + ([(trial_seeds[-1], True)] if unit else [])
            sampled = meta_bytes(meta) > cfg.full_compare_mb * (1 << 20)
            wheres = [compare_positions(meta, cfg.compare_points, gen) if sampled else P.ALL for _ in range(len(plan) + 1)]
            trials, outputs = [], []
            for i, (seed, signed) in enumerate(plan):
                try:
                    _, got = drive.trial(child, i, seed, signed, meta, slots, wheres[i], deadline)
                except drive.ChildError:
                    if signed:  # a signed trial only when the problem takes signed inputs
                        break
                    raise
                if signed and not _finite(got):  # log of a negative input says nothing
                    break
                trials.append((seed, signed))
                outputs.append(got)
            state, gpu = ready.get("state") or {}, str(ready.get("gpu", "cpu"))
            del ready
            n = timed_call_count(calls, meta, cfg.timing_output_gb) if timed else calls
            positions = [sample_positions(meta, cfg.sample_points, gen) for _ in range(n)]
            kept = wheres[:len(trials)] + [wheres[-1]]  # the trials kept, then the decoy's
            ref = Reference(trials, outputs, state, fresh_seeds(n), positions, [], gpu=gpu,
                            meta=meta, trial_positions=kept if sampled else None, init_seed=init_seed)

            def decoy_trial() -> bool:
                """The decoy trial (last of the eager model's, as for a candidate): signed when the signed
                trial was kept, so that a copy of the input differs from the answer. If the model cannot run
                it, no candidate gets one (an error ends the child: nothing else is asked of it)."""
                decoy = (decoy_seed, trials[-1][1])
                try:
                    _, got = drive.trial(child, len(plan), decoy[0], decoy[1], meta, slots, wheres[-1],
                                         time.monotonic() + cfg.run_timeout_s)
                except drive.ChildError:
                    return False
                ref.decoy, ref.decoy_output = decoy, list(got)
                return True

            if not timed:  # the values at some of the new timing inputs' positions; the clock is the cached one's
                deadline = time.monotonic() + cfg.timing_timeout_s
                checked = sorted(random.SystemRandom().sample(range(n), min(n, DRAW_CHECKED_CALLS)))
                _, got = drive.timed_calls(child, [ref.timing_seeds[i] for i in checked], meta, slots,
                                           [positions[i] for i in checked], deadline)
                ref.samples = [None] * n
                for i, values in zip(checked, got):
                    ref.samples[i] = values
                if decoy_trial():
                    child.send({"op": P.OP_BYE})
                return ref
            shared.close()
            with slot.timing():
                deadline = time.monotonic() + cfg.timing_timeout_s
                drive.ask(child, {"op": P.OP_WARMUP, "seeds": fresh_seeds(cfg.warmup_trials)}, P.WARM, deadline)
                started = time.monotonic()
                ref.clock, ref.samples = drive.timed_calls(child, ref.timing_seeds, meta, slots, positions, deadline)
                if self.ctx.activity is not None:
                    ref.contended = self.ctx.activity.overlapping(slot.index, started, time.monotonic())
                if slot.on_gpu:
                    ref.baseline_ms["eager"] = list(ref.clock.reported_ms)
                if not decoy_trial():
                    return ref
                if slot.on_gpu and "compile" in baselines:
                    child.send({"op": P.OP_COMPILE})
                    drive.ask(child, {"op": P.OP_WARMUP, "seeds": fresh_seeds(max(cfg.warmup_trials, 3))}, P.WARM,
                              deadline)
                    compiled, _ = drive.timed_calls(child, ref.timing_seeds, meta, slots, positions, deadline)
                    ref.baseline_ms["compile"] = list(compiled.reported_ms)
            child.send({"op": P.OP_BYE})
            return ref
        except drive.ChildError as exc:
            failed.error = clean_error(str(exc.msg.get("message", "")), child.scratch, self.ctx.secrets)
        except TimeoutError:
            failed.error = "the reference timed out"
        except (EOFError, ProtocolViolation):
            failed.error = "the reference child died\n" + clean_error(child.stderr_tail(), child.scratch, self.ctx.secrets)
        except Exception as exc:  # noqa: BLE001 - outputs the arena cannot hold (a dtype it does not know), ...
            failed.error = f"the reference cannot be judged here: {str(exc)[:300]}"
        finally:
            shared.close()  # the start-up slot too, if READY never came
            child.close()
        return failed


def start_reference(ctx: PoolContext, slot: Slot, problem_code: str, init_seed: int) -> Child:
    """A trusted child that runs the problem's Model (weights from `init_seed`) on the slot's device, forked
    with an arena of its own (grown once the outputs' layout is known)."""
    job = {"problem_code": problem_code, "init_seed": init_seed, "device": slot.device, "warm_triton": slot.on_gpu}
    return ctx.child(slot, "reference", job, arena=Arena())


def await_ready(child: Child, budget_s: float) -> dict[str, Any]:
    """A trusted child's sandbox report and READY (its weights and device), within `budget_s`."""
    deadline = time.monotonic() + budget_s
    child.ask(None, "sandbox", deadline)
    return drive.ask(child, None, P.READY, deadline, TRUSTED_BOUND)


def trial_order(ref: Reference, rng: random.Random) -> list[int]:
    """The order in which a candidate is asked the trials: the parent's choice, different each time."""
    order = list(range(len(ref.trials)))
    rng.shuffle(order)
    return order


def timed_order(checked: list[bool], head: int, rng: random.Random) -> list[int]:
    """The order of a candidate's timed calls (indices into the draw's timing seeds): random, except that
    the first `head` places (the calls a time budget never cuts, evaluator.timing_budget_s) hold half of
    the calls whose outputs are compared (`checked`), so a candidate stopped early is still checked; the
    rest of them, among the other calls, check the tail. The child sees only fresh seeds either way."""
    want = [i for i, c in enumerate(checked) if c]
    rest = [i for i, c in enumerate(checked) if not c]
    rng.shuffle(want)
    rng.shuffle(rest)
    head = min(head, len(checked))
    early = want[:min((len(want) + 1) // 2, head)]
    first = early + rest[:head - len(early)]
    first += want[len(early):len(early) + head - len(first)]  # too few unchecked calls to fill the head
    taken = set(first)
    tail = [i for i in want + rest if i not in taken]
    rng.shuffle(first)
    rng.shuffle(tail)
    return first + tail


def decoy_place(trials: int, rng: random.Random) -> int:
    """Where among `trials` trial requests the decoy trial goes: anywhere but first (an autotuner picks
    its configuration on its first call, which must not be a skipped one), uniformly, so that no count
    of calls tells the child which one it is."""
    return rng.randint(1, trials)


# The fields of a Reference that a draw of inputs decides; the rest is measured once per problem and device.
_DRAWN = ("trials", "outputs", "timing_seeds", "positions", "samples", "trial_positions", "decoy", "decoy_output")
