"""The timing stage's bookkeeping with the child stood in (the GPU's profiler is not on this machine): the
profiled call is one of the timed calls, its share reaches the verdict, and nothing profiles twice.

A GPU run once flagged every honest KernelBench loss kernel `output_not_from_kernel`: the share measured in
the profiled timed call never reached the verdict, so the judge's rule for outputs PyTorch finished saw none.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NoReturn

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import protocol as P
from kforge.evaluator.arena import Where
from kforge.evaluator.reference import Reference
from kforge.evaluator.timing_stage import TimingStage
from kforge.evaluator.verdict import Status, Verdict


class _Child:
    """Answers every request at once; the profiled timed call reports a share of 0.9, as the child's
    profiler would for a loss kernel that does all but the final division."""

    arena = None

    def __init__(self) -> None:
        self.profiled_calls = 0
        self.profile = False

    def ask(self, request: dict[str, Any] | None, expect: str, deadline: float, max_bytes: int) -> dict[str, Any]:
        if request is not None and request.get("op") == P.OP_TIME:
            self.profile = bool(request.get("profile"))
            self.profiled_calls += self.profile
        if request is not None and request.get("op") == P.OP_PROFILE:
            self.profiled_calls += 1
            return {"type": P.PROFILE, "coverage": 0.9}
        evidence = {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0, "outputs_finished": 1}
        return {"type": expect, "ms": 0.5, "coverage": 0.9 if self.profile else None, "evidence": evidence}

    def read(self, meta: list[Any], slots: list[Any], where: Where, plain: list[Any] | None = None) -> list[Any]:
        return [None]


def _reference(samples: list, clock=None) -> Reference:
    """A draw of len(samples) timed calls (a sample None: a call nobody compares), with the reference's `clock`."""
    n = len(samples)
    return Reference(trials=[], outputs=[], state={}, timing_seeds=list(range(n)), positions=[[None]] * n,
                     samples=samples, meta=[None], clock=clock)


class _Stage(TimingStage):
    def __init__(self, coverage: bool) -> None:
        self.cfg = EvaluatorConfig(coverage=coverage)
        self.ctx = SimpleNamespace(activity=None, cfg=self.cfg)
        self.slot = SimpleNamespace(on_gpu=True, index=0)
        self.ref = _reference([None] * 30)
        self.v = Verdict(Status.CORRECT, timing_meaningful=True)
        self.child = _Child()
        self.durations = {}
        self.trial_evidence = [{"kernels": 1, "kernels_on_data": 1, "outputs_finished": 1}]
        self.profiled = False
        self.problem_code = ""
        self.stage = "run"


def test_the_share_measured_in_a_timed_call_reaches_the_verdict_and_is_not_measured_again() -> None:
    for coverage in (False, True):  # a finished output is profiled whether or not every candidate is
        stage = _Stage(coverage)
        stage._timing()
        assert stage.profiled and stage.v.coverage == 0.9
        assert "output_not_from_kernel" not in stage.v.flags, stage.v.details
        assert stage.child.profiled_calls == 1
        assert stage.durations["timed_calls"] == 30


def test_without_a_finished_output_or_evaluator_coverage_nothing_is_profiled() -> None:
    stage = _Stage(coverage=False)
    stage.trial_evidence = [{"kernels": 1, "kernels_on_data": 1}]
    stage._timing()
    assert not stage.profiled and stage.v.coverage is None and stage.child.profiled_calls == 0


class _Tick:
    """The parent's clock in drive.py, moved only by the stood-in child: no test here waits on real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _SkippingChild(_Child):
    """An H100's loop (1 ms of set-up and copy-out) around a 5 ms kernel, every report forged at 0.001 ms, and
    one timed call, whose outputs nobody compared, that computed nothing: its wall is the bare loop."""

    def __init__(self, tick: _Tick, skip_seed: int) -> None:
        super().__init__()
        self.tick, self.skip_seed, self.seed = tick, skip_seed, -1

    def ask(self, request: dict[str, Any] | None, expect: str, deadline: float, max_bytes: int) -> dict[str, Any]:
        if request is not None and request.get("op") == P.OP_TIME:
            self.seed = int(request["seed"])
            self.tick.now += (0.5 if self.seed == self.skip_seed else 5.5) * 1e-3  # to the window's end
        elif expect == P.TIMED:
            self.tick.now += 0.5e-3  # the copy-out, the answer, the read
        evidence = {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0}
        return {"type": expect, "ms": 0.001, "coverage": None, "evidence": evidence}


def test_a_call_nobody_compared_does_not_set_the_parents_clock(monkeypatch) -> None:
    """A draw compares 16 of its 100 timed calls (reference.DRAW_CHECKED_CALLS). The parent's least window and
    least wall once came from every call: one unchecked call that computed nothing (9 in 10 land unchecked
    after the first 20) made any forged report consistent and set the figure's floor at the bare loop's
    (5 ms x 1/6 / 2 = 0.42 ms: 12x for a kernel as fast as the reference's). The clock now counts only the
    compared calls, and the forged report is flagged (the twin cannot run here: the first finding stands)."""
    from kforge.evaluator import drive, timing_stage
    from kforge.evaluator.recheck import TwinFailed
    from kforge.evaluator.timing_check import Clock

    tick = _Tick()
    monkeypatch.setattr(drive, "time", tick)

    def no_twin(*args: object, **kwargs: object) -> NoReturn:
        raise TwinFailed("no twin here")

    monkeypatch.setattr(timing_stage, "paired_calls", no_twin)
    stage = _Stage(coverage=False)
    n, checked = 100, set(range(0, 96, 6))  # 16 compared calls
    stage.ref = _reference([[None] if i in checked else None for i in range(n)],
                           Clock(wall_ms=[6.0] * n, reported_ms=[5.0] * n, window_ms=[5.5] * n))
    stage.trial_evidence = [{"kernels": 1, "kernels_on_data": 1}]
    stage.child = _SkippingChild(tick, skip_seed=1)  # call 1 is never compared
    stage._timing()
    assert "timing_inconsistent" in stage.v.flags, stage.v.details
    assert stage.v.kernel_ms is None and abs(stage.v.details["clock_speedup"] - 1.0) < 1e-6


def test_outputs_pytorch_finished_only_when_re_measured_are_judged_as_in_the_first_calls(monkeypatch) -> None:
    """A candidate sees when it is re-measured (recheck.py: a pause while a twin starts, then calls at a twin's
    pace). Its trials and first timed calls had its kernels write every output (nothing profiled: coverage
    is off); once re-measured, a copy kernel and PyTorch's own reduction of the copy answered. The re-measured
    calls' evidence is read by the rule for outputs PyTorch finished, as every other call's is."""
    from kforge.evaluator import drive, timing_stage
    from kforge.evaluator.timing_check import Clock

    tick = _Tick()
    monkeypatch.setattr(drive, "time", tick)
    finished = {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0, "outputs_finished": 1}

    def paired(ctx, slot, child, code, seed, meta, slots, size, answers):  # noqa: ANN001, ANN202
        answers += [{"evidence": finished}] * 16
        both = Clock(wall_ms=[6.0] * 16, reported_ms=[5.0] * 16, window_ms=[5.5] * 16)
        return both, both, [[None]] * 16, [[None]] * 16

    monkeypatch.setattr(timing_stage, "paired_calls", paired)
    stage = _Stage(coverage=False)
    n = 30
    stage.ref = _reference([[None]] * n, Clock(wall_ms=[6.0] * n, reported_ms=[5.0] * n, window_ms=[5.5] * n))
    stage.trial_evidence = [{"kernels": 1, "kernels_on_data": 1}]
    stage.child = _SkippingChild(tick, skip_seed=-1)  # every call 5 ms, reported 0.001: the first check flags it
    stage._timing()
    assert stage.v.details["recheck"]["consistent"] and not stage.profiled
    assert "output_not_from_kernel" in stage.v.flags, stage.v.details


def _paired_rounds(monkeypatch, rounds: list[float]) -> list[int]:
    """paired_calls stood in: re-measure k shows the candidate `rounds[k]` ms per call more than its twin after
    the window (twin: 1 ms window, 0.4 ms after, 0.5 ms reported). Returns the list of re-measures made."""
    from kforge.evaluator import timing_stage
    from kforge.evaluator.timing_check import Clock

    made: list[int] = []

    def paired(ctx, slot, child, code, seed, meta, slots, size, answers):  # noqa: ANN001, ANN202
        extra = rounds[len(made)]
        made.append(len(made))
        answers += [{"evidence": {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0}}] * 16
        twin = Clock(wall_ms=[1.4] * 16, reported_ms=[0.5] * 16, window_ms=[1.0] * 16)
        mine = Clock(wall_ms=[1.4 + extra] * 16, reported_ms=[0.5] * 16, window_ms=[1.0] * 16)
        return mine, twin, [[None]] * 16, [[None]] * 16

    monkeypatch.setattr(timing_stage, "paired_calls", paired)
    return made


def _flagged_first(monkeypatch) -> _Stage:
    """A stage whose first check flags work after the window (the reference's clock was quiet)."""
    from kforge.evaluator import drive
    from kforge.evaluator.timing_check import Clock

    tick = _Tick()
    monkeypatch.setattr(drive, "time", tick)
    stage = _Stage(coverage=False)
    n = 30
    stage.ref = _reference([[None]] * n, Clock(wall_ms=[1.1] * n, reported_ms=[0.5] * n, window_ms=[1.0] * n))
    stage.trial_evidence = [{"kernels": 1, "kernels_on_data": 1}]

    class Loaded(_SkippingChild):  # honest 0.5 ms reports, 5 ms after each window: a loaded machine
        def ask(self, request, expect, deadline, max_bytes):  # noqa: ANN001, ANN202
            answer = super().ask(request, expect, deadline, max_bytes)
            if expect == P.TIMED:
                self.tick.now += 4.5e-3
            return {**answer, "ms": 0.5}

    stage.child = Loaded(tick, skip_seed=-1)
    return stage


def test_a_burst_that_tilts_one_re_measure_is_cleared_by_the_next(monkeypatch) -> None:
    """A GPU run beside a busy pool flagged an honest GELU kernel (KernelBench 88) after one re-measure:
    "3.454 ms per call more than the reference from the window's end to the outputs read, paired call by
    call". A second re-measure that does not show it clears the flag; one that does keeps it."""
    made = _paired_rounds(monkeypatch, [3.5, 0.0])
    stage = _flagged_first(monkeypatch)
    stage._timing()
    assert len(made) == 2 and not stage.v.flags, stage.v.details
    assert stage.v.details["recheck"] == {"first": stage.v.details["recheck"]["first"], "made": True, "rounds": 2,
                                          "consistent": True}
    assert stage.v.kernel_ms == 0.5

    made = _paired_rounds(monkeypatch, [3.5, 3.5])  # work after the window every time: flagged
    stage = _flagged_first(monkeypatch)
    stage._timing()
    assert len(made) == 2 and stage.v.flags == ["timing_inconsistent"], stage.v.details
    assert "paired call by call" in stage.v.details["reason"]

    made = _paired_rounds(monkeypatch, [0.0])  # the first re-measure clears it: no second
    stage = _flagged_first(monkeypatch)
    stage._timing()
    assert len(made) == 1 and not stage.v.flags
