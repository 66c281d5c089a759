"""Timed runs that shared their GPU with a learner step or the engine's decoding are named in the verdict and
counted per step (`timing/contended`)."""

from __future__ import annotations

import pytest

from fake_parts import Clock
from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import EvalPool, Status, Verdict
from kforge.evaluator.contention import GpuActivity
from kforge.policy.records import Trajectory, Turn
from kforge.problems.record import Problem
from kforge.train.metrics import rollout_metrics
from locations import CANDIDATES

RELU = (CANDIDATES / "manifest.py").read_text().split("RELU = '''")[1].split("'''")[0]


def test_overlap_is_per_device_and_per_moment():
    clock = Clock()
    activity = GpuActivity(clock)
    clock.now = 10.0
    with activity.busy("learner", [1, 2]):
        clock.now = 20.0
        assert activity.overlapping(2, 15.0, 16.0) == ["learner"]  # still running
    with activity.busy("rollout", [0]):
        clock.now = 30.0
    assert activity.overlapping(1, 5.0, 9.9) == []  # before the step
    assert activity.overlapping(1, 19.0, 25.0) == ["learner"]  # the run's start overlapped the step's end
    assert activity.overlapping(0, 19.0, 25.0) == ["rollout"] and activity.overlapping(3, 0.0, 99.0) == []
    assert activity.overlapping(None, 0.0, 99.0) == []  # nothing ran on the CPU


def test_a_run_timed_during_a_learner_step_on_its_device_says_so(tmp_path):
    """The real pool on the CPU (the device every role shares there): a correct kernel timed while the learner
    is marked busy on the CPU names it; timed while the learner is busy on another device, it does not."""
    good = (CANDIDATES / "relu_correct.py").read_text()
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=20.0, compile_timeout_s=60.0, timing_timeout_s=20.0,
                          memory_limit_gb=4.0, cpu_workers=1)
    activity = GpuActivity()
    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache", activity=activity) as pool:
        problem = Problem(1, 9001, "9001_Tiny_ReLU", RELU)
        with activity.busy("learner", [3]):  # another GPU's work does not touch this device
            apart = pool.submit(problem, good).result(timeout=300)
        with activity.busy("learner", None):
            shared = pool.submit(problem, good).result(timeout=300)
    assert apart.status is Status.CORRECT and "timing_contended" not in apart.details
    assert shared.status is Status.CORRECT and shared.details["timing_contended"] == ["learner"]


@pytest.mark.slow  # a pool times references beside a busy learner
def test_a_reference_timed_beside_a_learner_step_is_not_kept(tmp_path):
    """Its baseline would inflate every speedup of its problem for the whole run: the verdicts judged against it
    say so, it never reaches the disk cache, and it is timed again after the back-off."""
    good = (CANDIDATES / "relu_correct.py").read_text()
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=20.0, compile_timeout_s=60.0, timing_timeout_s=20.0,
                          memory_limit_gb=4.0, cpu_workers=1, reference_retry_s=30.0)
    activity = GpuActivity()
    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache", activity=activity) as pool:
        clock = pool.references.clock = Clock()
        problem = Problem(1, 9001, "9001_Tiny_ReLU", RELU)
        with activity.busy("rollout", None):
            first = pool.submit(problem, good).result(timeout=300)
        again = pool.submit(problem, good).result(timeout=300)  # within the back-off: the same reference
        stored = list((tmp_path / "cache" / "reference").glob("*.pt"))
        clock.now = 31.0
        later = pool.submit(problem, good).result(timeout=300)
    assert first.correct and first.details["timing_contended"] == ["rollout", "rollout (reference)"]
    assert again.details["timing_contended"] == ["rollout (reference)"] and stored == []
    assert later.correct and "timing_contended" not in later.details
    assert list((tmp_path / "cache" / "reference").glob("*.pt"))  # a quiet reference is cached as before


def test_the_step_counts_contended_timed_runs_once_each():
    contended = Verdict(Status.CORRECT, details={"timing_contended": ["learner"]})
    quiet = Verdict(Status.CORRECT)

    def turn(v):
        return Turn(0, [1], [2], "x", [-0.1], 0, verdict=v)

    trajs = [Trajectory("1/1", 0, [turn(contended)]), Trajectory("1/1", 1, [turn(contended)]),  # a cache hit
             Trajectory("1/2", 0, [turn(quiet), turn(None)])]
    assert rollout_metrics(trajs, {"1/1": 1, "1/2": 1})["timing/contended"] == 1.0
