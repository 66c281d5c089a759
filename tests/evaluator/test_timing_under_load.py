"""Timing flags on a loaded machine: honest kernels are never `timing_inconsistent`, deferral still is.

The reference's clock is measured once per problem and cached; a candidate is timed later, maybe beside
other work. On a busy 2-core machine an honest built-in solution was flagged ("13.97 ms per call from the
window's end to the outputs read, the reference 0.8136 ms"): its calls were slowed by the load, the
reference's had not been. Here the references are measured on a quiet machine, then every built-in solution
is judged twice with processes spinning on every core, and the deferral attack (work moved after the timed
window, in-process layers off) is judged under the same load.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import EvalPool, Status
from kforge.problems import builtin_problems
from kforge.problems.record import Problem
from locations import CANDIDATES

BUSY_PER_CORE = 2


@contextlib.contextmanager
def busy_cpu() -> Iterator[None]:
    """Processes spinning on every core (more of them than cores) while the block runs."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(BUSY_PER_CORE * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()


def _config(**extra: object) -> EvaluatorConfig:
    return EvaluatorConfig(num_correct_trials=3, run_timeout_s=120.0, compile_timeout_s=120.0,
                           timing_timeout_s=120.0, memory_limit_gb=4.0, cpu_workers=2, **extra)


def _manifest_problem(key: str) -> Problem:
    import importlib.util

    spec = importlib.util.spec_from_file_location("kforge_manifest_for_load", CANDIDATES / "manifest.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    level, pid, name, code = mod.PROBLEMS[key]
    return Problem(level, pid, name, code)


@pytest.mark.slow
def test_honest_kernels_are_never_flagged_beside_busy_processes(tmp_path: Path) -> None:
    problems = builtin_problems()
    jobs = [(p, p.solution, "triton") for p in problems]
    with EvalPool(_config(), devices=None, cache_dir=tmp_path) as pool:
        quiet = pool.evaluate_many(jobs)  # the references' clocks are measured (and cached) here
        assert all(v.correct for v in quiet), [(p.key, v.status.value, v.flags) for p, v in zip(problems, quiet)]
        with busy_cpu():
            loaded = [pool.evaluate_many(jobs) for _ in range(2)]
    flagged = [(p.key, v.status.value, v.flags, v.details.get("reason"), v.details.get("recheck"))
               for verdicts in loaded for p, v in zip(problems, verdicts) if not v.correct or v.flags]
    assert not flagged, flagged


@pytest.mark.slow
def test_work_after_the_window_is_still_flagged_beside_busy_processes(tmp_path: Path) -> None:
    """skip_timed_calls.py computes each timed call's output only when the harness copies it out: the
    paired re-measure sees the same gap the first check saw, so the flag stands under load."""
    relu = _manifest_problem("relu")
    code = (CANDIDATES / "attacks" / "skip_timed_calls.py").read_text()
    honest = (CANDIDATES / "relu_correct.py").read_text()
    with EvalPool(_config(static_checks=False, audit_hook=False), devices=None, cache_dir=tmp_path) as pool:
        assert pool.submit(relu, honest).result(timeout=300).correct  # the reference's clock, measured quiet
        with busy_cpu():
            verdicts = [pool.submit(relu, code).result(timeout=600) for _ in range(2)]
    for v in verdicts:
        assert v.status is Status.CORRECT and "timing_inconsistent" in v.flags, (v.flags, v.details.get("reason"))
        assert v.details["recheck"]["made"] and not v.details["recheck"]["consistent"], v.details["recheck"]
