"""The real pool, two workers on one device: no GPU work of one worker (its child's start-up, its trials, a
reference run, a draw of inputs) runs while the other times a kernel. On the CPU the pool has no gate (its
timing means nothing); the test gives its device one, as every GPU has.

The two workers are steered so that, without the gate's shared holds, one's trials would run inside the
other's timing: the second worker to reach its trials waits until the first is timing (or waits to), and the
first, once timing, waits until the second is in its trials (or waits to). With the gate the second's trials
wait for the timing to end (or the timing for them), and the recorded intervals never overlap."""

from __future__ import annotations

import threading
import time

import pytest

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import EvalPool, Status, drive
from kforge.evaluator import protocol as P
from kforge.evaluator.context import PoolContext
from kforge.evaluator.examine import Examination
from kforge.evaluator.gate import EXCLUSIVE, DeviceGate
from kforge.problems.record import Problem
from locations import CANDIDATES

RELU = (CANDIDATES / "manifest.py").read_text().split("RELU = '''")[1].split("'''")[0]
PATIENCE_S = 120.0  # a step that waits longer than this means the steering went wrong


class Steering:
    """Records (thread, kind, start, end) of every stage and call that uses the device; kind is "timing" for
    what runs with the gate held alone, else "work". Steers the two workers as the module says."""

    def __init__(self, gate: DeviceGate) -> None:
        self.gate = gate
        self.lock = threading.Lock()
        self.spans: list[tuple[str, str, float, float]] = []
        self.arrived: list[str] = []  # threads, in the order they reached their trials
        self.timers: list[str] = []  # threads, in the order they reached their timing
        self.in_trials: set[str] = set()
        self.timing_started = False
        self.stuck: list[str] = []
        self.fork_at: dict[str, float] = {}

    def until(self, predicate, what: str) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while not predicate():
            if time.monotonic() > deadline:
                self.stuck.append(what)
                return
            time.sleep(0.002)

    def record(self, kind: str, start: float) -> None:
        with self.lock:
            self.spans.append((threading.current_thread().name, kind, start, time.monotonic()))

    def kind(self) -> str:
        return "timing" if self.gate.holding() == EXCLUSIVE else "work"

    def others(self, threads) -> set[str]:
        return set(threads) - {threading.current_thread().name}

    def timer_waiting(self) -> bool:
        return self.gate.waiting()[EXCLUSIVE] > 0

    def install(self, monkeypatch) -> None:
        for module, name in ((drive, "trial"), (drive, "timed_calls")):
            monkeypatch.setattr(module, name, self.recorded(getattr(module, name)))
        monkeypatch.setattr(PoolContext, "child", self.forked(PoolContext.child))
        monkeypatch.setattr(drive, "ask", self.started_up(drive.ask))
        monkeypatch.setattr(Examination, "_trials", self.trials(Examination._trials))
        monkeypatch.setattr(Examination, "_timing", self.timing(Examination._timing))

    def recorded(self, real):
        def call(*args, **kwargs):
            kind, start = self.kind(), time.monotonic()
            try:
                return real(*args, **kwargs)
            finally:
                self.record(kind, start)
        return call

    def forked(self, real):
        """A child starts its GPU work (CUDA, the model's weights) at fork, unasked: its start-up runs from
        the fork to its READY."""
        def call(*args, **kwargs):
            self.fork_at[threading.current_thread().name] = time.monotonic()
            return real(*args, **kwargs)
        return call

    def started_up(self, real):
        def call(child, request, expect, *args, **kwargs):
            try:
                return real(child, request, expect, *args, **kwargs)
            finally:
                if expect == P.READY:
                    self.record(self.kind(), self.fork_at[threading.current_thread().name])
        return call

    def trials(self, real):
        def call(exam, *args, **kwargs):
            me = threading.current_thread().name
            with self.lock:
                self.arrived.append(me)
                second = len(self.arrived) == 2
            if second:
                self.until(lambda: self.others(self.timers) or self.timer_waiting(), "the other worker timing")
            start = time.monotonic()
            with self.lock:
                self.in_trials.add(me)
            try:
                return real(exam, *args, **kwargs)
            finally:
                if second:  # still in its trials once the other's timed calls began (or the timer waits)
                    self.until(lambda: self.timing_started or self.timer_waiting(), "the timed calls")
                with self.lock:
                    self.in_trials.discard(me)
                self.record("work", start)
        return call

    def timing(self, real):
        def call(exam, *args, **kwargs):
            start = time.monotonic()
            with self.lock:
                self.timers.append(threading.current_thread().name)
                first = len(self.timers) == 1
            if first:
                self.until(lambda: self.others(self.in_trials) or any(self.gate.waiting().values()),
                           "the other worker's trials")
            self.timing_started = True
            try:
                return real(exam, *args, **kwargs)
            finally:
                self.record("timing", start)
        return call


@pytest.mark.slow  # a pool of workers timing on one device
def test_no_worker_uses_the_device_while_another_times_on_it(tmp_path, monkeypatch):
    good = (CANDIDATES / "relu_correct.py").read_text()
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=60.0, compile_timeout_s=120.0, timing_timeout_s=60.0,
                          memory_limit_gb=4.0, cpu_workers=2)
    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache") as pool:
        slot = pool._slots[0]
        slot.gate = DeviceGate()
        steering = Steering(slot.gate)
        steering.install(monkeypatch)
        problem = Problem(1, 9001, "9001_Tiny_ReLU", RELU)
        verdicts = [f.result(timeout=600) for f in [pool.submit(problem, good), pool.submit(problem, good)]]
    assert [v.status for v in verdicts] == [Status.CORRECT] * 2, [v.details.get("reason") for v in verdicts]
    assert steering.stuck == [] and len(set(steering.arrived)) == 2 and len(set(steering.timers)) == 2
    spans = steering.spans
    assert any(t.startswith("kforge-draw") for t, *_ in spans)  # the second evaluation's draw of inputs ran too
    overlaps = [(a, b) for a in spans if a[1] == "timing" for b in spans
                if b[0] != a[0] and a[2] < b[3] and b[2] < a[3]]
    assert overlaps == []


@pytest.mark.slow  # a pool of evaluation children
def test_start_ups_beyond_the_limit_wait_holding_nothing(tmp_path, monkeypatch):
    """`evaluator.startups_per_gpu`: with a limit of one, no two children (candidates, references, draws) are
    between their fork and their READY at once, a start-up that waits holds no gate (so a timer never waits
    for it), and three workers judging with timing on still finish, every verdict correct."""
    good = (CANDIDATES / "relu_correct.py").read_text()
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=60.0, compile_timeout_s=120.0, timing_timeout_s=60.0,
                          memory_limit_gb=4.0, cpu_workers=3, startups_per_gpu=1)
    lock, state = threading.Lock(), {"now": 0, "most": 0, "held_while_waiting": []}
    real_child, real_ask = PoolContext.child, drive.ask

    def child(ctx, slot, kind, *args, **kwargs):
        if kind in ("candidate", "reference"):
            with lock:
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
        return real_child(ctx, slot, kind, *args, **kwargs)

    def ask(child_, request, expect, *args, **kwargs):
        try:
            return real_ask(child_, request, expect, *args, **kwargs)
        finally:
            if expect == P.READY:
                with lock:
                    state["now"] -= 1

    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache") as pool:
        slot = pool._slots[0]
        slot.gate = DeviceGate()
        slot.startups = threading.BoundedSemaphore(cfg.startups_per_gpu)
        real_starting = type(slot).starting

        def starting(self):
            state["held_while_waiting"].append(self.gate.holding())
            return real_starting(self)

        monkeypatch.setattr(type(slot), "starting", starting)
        monkeypatch.setattr(PoolContext, "child", child)
        monkeypatch.setattr(drive, "ask", ask)
        problem = Problem(1, 9001, "9001_Tiny_ReLU", RELU)
        verdicts = [f.result(timeout=600) for f in [pool.submit(problem, good) for _ in range(4)]]
    assert [v.status for v in verdicts] == [Status.CORRECT] * 4, [v.details.get("reason") for v in verdicts]
    assert state["most"] == 1 and state["now"] == 0, state
    assert len(state["held_while_waiting"]) >= 5 and set(state["held_while_waiting"]) == {None}, state
