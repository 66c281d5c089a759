"""The timing stage's bookkeeping with the child stood in (the GPU's profiler is not on this machine): the
profiled call is one of the timed calls, its share reaches the verdict, and nothing profiles twice.

A GPU run once flagged every honest KernelBench loss kernel `output_not_from_kernel`: the share measured in
the profiled timed call never reached the verdict, so the judge's rule for outputs PyTorch finished saw none.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import protocol as P
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

    def read(self, meta: list[Any], slots: list[Any], where: Any, plain: list[Any] | None = None) -> list[Any]:
        return [None]


class _Stage(TimingStage):
    def __init__(self, coverage: bool) -> None:
        self.cfg = EvaluatorConfig(coverage=coverage)
        self.ctx = SimpleNamespace(activity=None, cfg=self.cfg)
        self.slot = SimpleNamespace(on_gpu=True, index=0)
        n = 30
        self.ref = Reference(trials=[], outputs=[], state={}, timing_seeds=list(range(n)), positions=[[None]] * n,
                             samples=[None] * n, meta=[None])
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
