"""A reference that failed once (a GPU out of memory while the learner peaks, say) is retried after a back-off,
and a verdict it spoiled is never served from the verdict cache: its problem stays in training."""

from __future__ import annotations

import asyncio
import time

import pytest

from fake_parts import Clock
from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import EvalPool, Status, Verdict
from kforge.policy.runner import VerdictCache
from kforge.problems.record import Problem
from locations import CANDIDATES

FLAKY = '''import time
import torch
import torch.nn as nn

READY_AT = {ready_at!r}


class Model(nn.Module):
    def forward(self, x):
        if time.time() < READY_AT:
            raise RuntimeError("CUDA out of memory: the device is busy for now")
        return torch.relu(x)


def get_inputs():
    return [torch.rand(48, 40)]


def get_init_inputs():
    return []
'''


@pytest.mark.slow  # waits out the reference's 45 s failing window in real time
def test_a_failed_reference_is_retried_after_its_back_off(tmp_path):
    """The real pool and reference child: the problem's Model fails until READY_AT (real time). Its failure is
    answered from memory during the back-off (still failing after READY_AT: it is not recomputed), and
    computed again once the back-off is over: the candidate is then judged correct."""
    good = (CANDIDATES / "relu_correct.py").read_text()
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=20.0, compile_timeout_s=60.0, timing_timeout_s=10.0,
                          memory_limit_gb=4.0, cpu_workers=1, reference_retry_s=30.0)
    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache") as pool:
        clock = pool.references.clock = Clock()
        ready_at = time.time() + 45.0
        problem = Problem(1, 9101, "9101_Flaky_ReLU", FLAKY.format(ready_at=ready_at))
        first = pool.submit(problem, good).result(timeout=300)
        assert time.time() < ready_at  # the premise: the first reference ran while the Model still failed
        # Out of memory: "does not fit" (unsupported), which must not outlive a GPU that was only busy.
        assert first.status is Status.UNSUPPORTED and first.details.get("reference_error"), first
        assert "out of memory" in first.error
        time.sleep(max(0.0, ready_at - time.time()) + 0.5)
        clock.now = 29.0  # within the back-off: the failure is answered, not recomputed
        assert pool.submit(problem, good).result(timeout=300).details.get("reference_error")
        clock.now = 31.0  # past it: computed again, and the Model works now
        again = pool.submit(problem, good).result(timeout=300)
        assert again.status is Status.CORRECT and again.correct, (again.status, again.error)


def test_the_verdict_cache_does_not_keep_a_verdict_the_reference_spoiled():
    async def main():
        cache = VerdictCache()
        for code, verdict in (("a", Verdict(Status.RUNTIME_ERROR, details={"reference_error": True})),
                              ("b", Verdict(Status.INCORRECT))):
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(verdict)
            cache.store("p", code, fut)
        return cache.lookup("p", "a"), cache.lookup("p", "b")

    spoiled, kept = asyncio.run(main())
    assert spoiled is None and kept is not None
