"""The reference side of every comparison, computed once per problem and device and cached.

A trusted child (it runs the problem's Model, never candidate code) is driven through the same
protocol as a candidate: outputs for the correctness trials, then the timed batches on the timing
seeds, whose samples at secret positions become what every candidate's timed calls must match,
and whose parent-side clock says what the harness itself costs per call. On a GPU its event
times are the eager (and optionally torch.compile) baseline.

The cache lives in kforge's cache folder, which no child can read: reference outputs never reach
a candidate's process.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.evaluator import protocol as P
from kforge.evaluator.children import Child, ProtocolViolation, Slot
from kforge.evaluator.context import PoolContext, sha
from kforge.evaluator.feedback import clean_error
from kforge.evaluator.judge import Clock, compare_positions, meta_bytes, sample_positions
from kforge.problems.record import Problem

TRUSTED_BOUND = 1 << 40  # the reference child runs no candidate code: its answers are not size-capped
FORMAT = 2  # bump when the cached Reference record changes


@dataclass
class Reference:
    trials: list[tuple[int, bool]]  # (seed, signed) of the correctness trials
    outputs: list[list[Any]]  # the reference outputs of each trial
    state: dict[str, Any]  # initial weights, copied into ModelNew
    timing_seeds: list[int]
    batch: int  # timed calls per batch (bounded by the outputs a child keeps until sampled)
    positions: list[Any]  # per output: flat positions the parent samples
    samples: list[list[Any]]  # per timing seed: the reference values at those positions
    clock: Clock | None = None
    meta: list[Any] = field(default_factory=list)  # [shape, dtype] per output (None: a plain value)
    trial_positions: list[Any] | None = None  # where large outputs are compared; None: whole outputs
    baseline_ms: dict[str, list[float]] = field(default_factory=dict)
    gpu: str = "cpu"
    error: str = ""


def _seeds(salt: str, key: str, purpose: str, n: int) -> list[int]:
    return [int(sha(salt, key, purpose, str(i))[:15], 16) for i in range(n)]


def _finite(outputs: list[Any]) -> bool:
    return all(not isinstance(o, torch.Tensor) or not o.is_floating_point() or bool(torch.isfinite(o).all())
               for o in outputs)


def fresh_seeds(n: int) -> list[int]:
    """Seeds for calls whose outputs nobody checks (warm-up): new every time, so no input repeats."""
    rng = random.SystemRandom()
    return [rng.getrandbits(60) for _ in range(n)]


def timed_batches(child: Child, seeds: list[int], batch: int, positions: list[Any], deadline: float,
                  sample_bound: int) -> tuple[Clock, list[list[Any]], str]:
    """Run the timed batches the parent chose and time them with the parent's clock.

    The clock runs from each `time` request to the arrival of that batch's samples, so work the child
    moves out of its own timing window, skips and redoes when asked for samples, or defers, is counted.
    Returns (clock, samples per call, error text)."""
    wall = 0.0
    ms: list[float] = []
    samples: list[list[Any]] = []
    for start in range(0, len(seeds), batch):
        chunk = seeds[start:start + batch]
        t0 = time.perf_counter()
        timed = child.ask({"op": P.OP_TIME, "seeds": chunk}, P.TIMED, deadline, 64 * len(chunk) + P.HEADROOM)
        if timed["type"] == P.ERROR:
            return Clock(wall, ms), samples, str(timed.get("message", ""))
        got = child.ask({"op": P.OP_SAMPLE, "positions": positions}, P.SAMPLES, deadline, sample_bound)
        wall += time.perf_counter() - t0
        if got["type"] == P.ERROR:
            return Clock(wall, ms), samples, str(got.get("message", ""))
        reported = timed.get("ms")
        if not isinstance(reported, list) or len(reported) != len(chunk):
            raise ProtocolViolation("timings for calls that were not asked")
        ms += [float(x) for x in reported]
        samples += list(got.get("values") or [])
    return Clock(wall, ms), samples, ""


class ReferenceCache:
    """Reference results per (problem, trial plan, device), in memory and on disk."""

    def __init__(self, ctx: PoolContext) -> None:
        self.ctx = ctx
        self._mem: dict[tuple[str, str], Reference] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, slot: Slot, problem: Problem, baselines: tuple[str, ...] = ()) -> Reference:
        cfg = self.ctx.cfg
        calls = cfg.timing_trials if slot.on_gpu else cfg.cpu_timing_calls
        baselines = baselines if slot.on_gpu else ()
        plan = (f"v{FORMAT}|{cfg.num_correct_trials}|{calls}|{cfg.sample_points}|{cfg.warmup_trials}"
                f"|{cfg.full_compare_mb}|{cfg.compare_points}")
        key = (sha(problem.code, plan), slot.tag)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            ref = self._mem.get(key)
            disk = self.ctx.cache_dir / "reference" / f"{key[0]}-{sha(key[1])}.pt"
            if ref is None and disk.exists():
                try:
                    ref = Reference(**torch.load(disk, weights_only=True))
                    ref.clock = Clock(**ref.clock) if isinstance(ref.clock, dict) else ref.clock
                except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed
                    ref = None
            missing = [b for b in baselines if b not in (ref.baseline_ms if ref else {})]
            if ref is None or (missing and not ref.error):
                ref = self._compute(slot, problem, key[0], calls, missing or list(baselines))
                if not ref.error:
                    disk.parent.mkdir(parents=True, exist_ok=True)
                    data = dict(ref.__dict__)
                    data["clock"] = ref.clock.__dict__ if ref.clock else None
                    tmp = disk.with_suffix(".tmp")
                    torch.save(data, tmp)
                    tmp.replace(disk)
            self._mem[key] = ref
            return ref

    def _compute(self, slot: Slot, problem: Problem, key: str, calls: int, baselines: list[str]) -> Reference:
        cfg = self.ctx.cfg
        salt = self.ctx.salt()
        trial_seeds = _seeds(salt, key, "trial", cfg.num_correct_trials + 1)
        timing_seeds = _seeds(salt, key, "timing", calls)
        job = {"problem_code": problem.code, "init_seed": trial_seeds[0], "device": slot.device,
               "warm_triton": slot.on_gpu}
        child = self.ctx.child(slot, "reference", job)
        failed = Reference([], [], {}, [], 1, [], [])
        try:
            deadline = time.monotonic() + cfg.compile_timeout_s
            child.ask(None, "sandbox", deadline)
            ready = child.ask(None, P.READY, deadline, TRUSTED_BOUND)
            if ready["type"] == P.ERROR:
                failed.error = clean_error(str(ready.get("message", "")), child.scratch, self.ctx.secrets)
                return failed
            gpu = str(ready.get("gpu", "cpu"))
            deadline = time.monotonic() + cfg.run_timeout_s
            trials, outputs = [], []
            meta: list[Any] = []
            where: Any = P.ALL
            gen = torch.Generator().manual_seed(int(sha(salt, key, "positions")[:15], 16))
            plan = [(s, False) for s in trial_seeds[:-1]] + [(trial_seeds[-1], True)]
            for i, (seed, signed) in enumerate(plan):
                ans = child.ask({"op": P.OP_TRIAL, "id": i, "seed": seed, "signed": signed}, P.TRIAL, deadline,
                                TRUSTED_BOUND)
                if ans["type"] == P.ERROR and not signed:
                    failed.error = clean_error(str(ans.get("message", "")), child.scratch, self.ctx.secrets)
                    return failed
                if i == 0:
                    meta = list(ans["meta"])
                    if meta_bytes(meta) > cfg.full_compare_mb * (1 << 20):
                        where = compare_positions(meta, cfg.compare_points, gen)
                    unit = bool(ans.get("unit"))
                if signed and (not unit or ans["type"] == P.ERROR):
                    break  # a signed trial only when the inputs lie in [0, 1): a copy passes ReLU on them
                values = child.ask({"op": P.OP_SAMPLE, "positions": where}, P.SAMPLES, deadline, TRUSTED_BOUND)
                got = list(values["values"][0]) if values["type"] == P.SAMPLES else []
                if signed and not _finite(got):  # log of a negative input says nothing
                    break
                trials.append((seed, signed))
                outputs.append(got)
            state = ready.get("state") or {}
            del ready
            positions = sample_positions(meta, cfg.sample_points, gen)
            out_bytes = max(meta_bytes(meta), 1)
            batch = max(1, min(calls, int(cfg.timing_memory_gb * (1 << 30)) // out_bytes))
            ref = Reference(trials, outputs, state, timing_seeds, batch, positions, [], gpu=gpu, meta=meta,
                            trial_positions=None if where == P.ALL else where)
            with slot.timing():
                deadline = time.monotonic() + cfg.timing_timeout_s
                child.ask({"op": P.OP_WARMUP, "seeds": fresh_seeds(cfg.warmup_trials)}, P.WARM, deadline)
                ref.clock, ref.samples, err = timed_batches(child, timing_seeds, batch, positions, deadline,
                                                            TRUSTED_BOUND)
                if err:
                    failed.error = "timing the reference failed: " + clean_error(err, child.scratch, self.ctx.secrets)
                    return failed
                if slot.on_gpu:
                    ref.baseline_ms["eager"] = list(ref.clock.reported_ms)
                    if "compile" in baselines:
                        child.send({"op": P.OP_COMPILE})
                        child.ask({"op": P.OP_WARMUP, "seeds": fresh_seeds(max(cfg.warmup_trials, 3))}, P.WARM,
                                  deadline)
                        compiled, _, err = timed_batches(child, timing_seeds, batch, positions, deadline, TRUSTED_BOUND)
                        if not err:
                            ref.baseline_ms["compile"] = list(compiled.reported_ms)
            child.send({"op": P.OP_BYE})
            return ref
        except TimeoutError:
            failed.error = "the reference timed out"
        except (EOFError, ProtocolViolation):
            failed.error = "the reference child died\n" + clean_error(child.stderr_tail(), child.scratch, self.ctx.secrets)
        finally:
            child.close()
        return failed


def trial_order(ref: Reference, rng: random.Random) -> list[int]:
    """The order in which a candidate is asked the trials: the parent's choice, different each time."""
    order = list(range(len(ref.trials)))
    rng.shuffle(order)
    return order
