"""The eval GPU's gate (evaluator/gate.py): timing holds it alone, the pool's other GPU work shares it. Real
threads; each step waits for the state it needs (a thread seen waiting, an event), never for a guessed time."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

from kforge.evaluator.gate import EXCLUSIVE, SHARED, DeviceGate

PATIENCE_S = 30.0  # how long a step may take before the test calls it stuck


def until(predicate, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        assert time.monotonic() < deadline, f"stuck: {what}"
        time.sleep(0.002)


class Holder(threading.Thread):
    """Takes one hold, says so (`got`), keeps it until `release` is set."""

    def __init__(self, gate: DeviceGate, kind: str, log: list[str], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.gate, self.kind, self.log = gate, kind, log
        self.got, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with self.gate.shared() if self.kind == SHARED else self.gate.exclusive():
            self.log.append(self.name)
            self.got.set()
            self.release.wait(PATIENCE_S)

    def finish(self) -> None:
        self.release.set()
        self.join(PATIENCE_S)
        assert not self.is_alive()


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them_all():
    gate, log = DeviceGate(), []
    a, b = Holder(gate, SHARED, log, "a"), Holder(gate, SHARED, log, "b")
    a.start(), b.start()
    assert a.got.wait(PATIENCE_S) and b.got.wait(PATIENCE_S)  # both at once: shared holds do not exclude
    timer = Holder(gate, EXCLUSIVE, log, "timer")
    timer.start()
    until(lambda: gate.waiting()[EXCLUSIVE] == 1, "the timer waiting")
    a.finish()
    assert not timer.got.is_set()  # b still holds it
    b.finish()
    assert timer.got.wait(PATIENCE_S)
    timer.finish()


def test_an_exclusive_hold_keeps_every_other_thread_out():
    gate, log = DeviceGate(), []
    timer = Holder(gate, EXCLUSIVE, log, "timer")
    timer.start()
    assert timer.got.wait(PATIENCE_S)
    work, other = Holder(gate, SHARED, log, "work"), Holder(gate, EXCLUSIVE, log, "other timer")
    work.start(), other.start()
    until(lambda: gate.waiting() == {SHARED: 1, EXCLUSIVE: 1}, "both waiting")
    assert log == ["timer"]
    timer.finish()
    assert other.got.wait(PATIENCE_S) and not work.got.is_set()  # timers first (the next test says why)
    other.finish()
    assert work.got.wait(PATIENCE_S)
    work.finish()
    assert log == ["timer", "other timer", "work"]


def test_a_waiting_timer_goes_before_work_that_asks_after_it():
    """Writer preference: trials that keep overlapping would otherwise keep the timer out for good."""
    gate, log = DeviceGate(), []
    first = Holder(gate, SHARED, log, "first trials")
    first.start()
    assert first.got.wait(PATIENCE_S)
    timer = Holder(gate, EXCLUSIVE, log, "timer")
    timer.start()
    until(lambda: gate.waiting()[EXCLUSIVE] == 1, "the timer waiting")
    later = Holder(gate, SHARED, log, "later trials")
    later.start()
    until(lambda: gate.waiting()[SHARED] == 1, "the later trials waiting")  # not let in beside the first
    first.finish()
    assert timer.got.wait(PATIENCE_S) and not later.got.is_set()
    timer.finish()
    assert later.got.wait(PATIENCE_S)
    later.finish()
    assert log == ["first trials", "timer", "later trials"]


def test_a_thread_that_holds_the_gate_cannot_ask_again():
    """Asking again would wait on itself behind a waiting timer: it fails at once, in either order."""
    gate = DeviceGate()
    with gate.shared():
        assert gate.holding() == SHARED
        with pytest.raises(RuntimeError), gate.exclusive():
            pass
    with gate.exclusive():
        with pytest.raises(RuntimeError), gate.shared():
            pass
    assert gate.holding() is None and gate.waiting() == {SHARED: 0, EXCLUSIVE: 0}
    with gate.exclusive():  # nothing was left held
        pass


def test_the_draw_pattern_ends_while_a_timer_waits():
    """The pool's own order (examine.run): a worker starts its child holding the gate shared, lets go, then
    waits for its draw of inputs, which another thread computes with a shared hold of its own; a timer asks
    in between. Each thread waits on another only while holding nothing, so all three finish."""
    gate = DeviceGate()
    draws = cf.ThreadPoolExecutor(max_workers=1)
    started, order = threading.Event(), []

    def draw() -> str:
        with gate.shared():
            order.append("draw")
            return "inputs"

    def worker() -> str:
        with gate.shared():  # the child's start-up
            order.append("start-up")
            started.set()
            until(lambda: gate.waiting()[EXCLUSIVE] == 1, "the timer waiting")
            drawn = draws.submit(draw)
            until(lambda: gate.waiting()[SHARED] == 1, "the draw waiting behind the timer")
        return drawn.result(PATIENCE_S)  # holding nothing

    def timer() -> None:
        started.wait(PATIENCE_S)
        with gate.exclusive():
            order.append("timing")

    with cf.ThreadPoolExecutor(max_workers=2) as threads:
        w, t = threads.submit(worker), threads.submit(timer)
        assert w.result(PATIENCE_S) == "inputs" and t.result(PATIENCE_S) is None
    draws.shutdown()
    assert order == ["start-up", "timing", "draw"]
