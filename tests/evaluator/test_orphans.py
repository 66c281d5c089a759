"""A trainer killed outright (kill -9, an out-of-memory kill) leaves no candidate running. The pool's zygote
goes when its socket closes; the child it forked for a check, and the candidate under it, die with their
parent (PR_SET_PDEATHSIG, asked again after the child drops to its own user, which clears it). A candidate
that never returns once spun on a core for good under init."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from locations import CANDIDATES, REPO

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool
    from kforge.problems.record import Problem

    problem = Problem(1, 9201, "9201_Tiny_ReLU", Path(sys.argv[1]).read_text())
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=300.0, compile_timeout_s=120.0, memory_limit_gb=4.0,
                          cpu_workers=1)
    pool = EvalPool(cfg, devices=None, cache_dir=Path(sys.argv[3]))
    pool.submit(problem, Path(sys.argv[2]).read_text())
    print(pool.ctx.work_dir, flush=True)
    time.sleep(600)
""")

RELU = (CANDIDATES / "manifest.py").read_text().split("RELU = '''")[1].split("'''")[0]  # the corpus's problem


def _holding(folder: str) -> list[int]:
    """Processes with a file open under `folder` (a check's child writes its output files there)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}").startswith(folder) for fd in fds):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.slow  # a pool in a process of its own, killed
def test_a_pool_killed_outright_leaves_no_candidate_running(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(RELU)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(problem), str(CANDIDATES / "hang.py"),
                             str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        work = proc.stdout.readline().strip()
        assert work, "the pool did not start"
        deadline = time.monotonic() + 120
        while not _holding(work) and time.monotonic() < deadline:  # the candidate's child is up, spinning
            time.sleep(0.5)
        assert _holding(work), "no check's child ever ran"
        time.sleep(2.0)  # inside its forward's endless loop by now
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while _holding(work) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _holding(work)
    for pid in left:  # never leave them to the rest of the suite
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not left, f"still running after the pool's process was killed: {left}"
