"""The trainer's own logic with fake model-backed parts (tests/fake_parts.py): per-step statistics in
pipelined mode, a learner process that hangs or dies, resume after that failure, transcripts.
The trainer, episode runner, verdict cache, run folder and the served learner process are real."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fake_parts import FakeBuilder, FakeEngine, FakeLearner, FakePool

from kforge.config.schema import KforgeConfig
from kforge.config.loader import to_yaml
from kforge.credit.rewards import score_turn
from kforge.policy.runner import EpisodeRunner, VerdictCache
from kforge.problems import builtin_problems
from kforge.runs.folder import RunFolder
from kforge.train.placement import Plan
from kforge.train.trainer import Parts, Trainer

SPLIT = Plan(["0", "1"], rollout=[0], learner=[1], eval=[1])  # two GPUs: the mode where steps overlap


def make_cfg(**log) -> KforgeConfig:
    cfg = KforgeConfig()
    cfg.episode.mode = "single_turn"
    cfg.dataset.batch_size, cfg.dataset.group_size, cfg.dataset.epochs = 1, 4, 2
    cfg.dataset.test_fraction = 0.0
    cfg.rollout.max_staleness = 1
    cfg.log.tensorboard, cfg.log.save_every = False, 1
    for k, v in log.items():
        setattr(cfg.log, k, v)
    return cfg


def make_trainer(tmp_path, cfg, learner, pool, name="r", run=None):
    problems = builtin_problems()[:2]
    engine = FakeEngine()
    runner = EpisodeRunner(engine, FakeBuilder(problems), pool.evaluate,
                           lambda turn, traj: score_turn(turn, cfg.reward, False), cfg, VerdictCache())
    run = run or RunFolder.create(tmp_path, name, to_yaml(cfg))
    return Trainer(cfg, run, SPLIT, problems, [], Parts(learner, engine, pool, runner, shares_model=False))


def test_pipelined_statistics_belong_to_their_own_step(tmp_path):
    """The next step's rollouts run while the learner trains. Each step reports its own evaluation time
    and cache hits: the first step of a problem evaluates its one kernel (the other samples hit the
    cache), a revisit evaluates nothing."""
    eval_s, learn_s = 0.5, 0.8
    cfg = make_cfg()
    pool = FakePool(eval_s)
    trainer = make_trainer(tmp_path, cfg, FakeLearner(step_s=learn_s), pool)
    assert trainer.pipelined and trainer.total_steps == 4
    assert asyncio.run(trainer.run_async()) == "finished"
    metrics = {m["step"]: m for m in trainer.run.metrics()}
    assert sorted(metrics) == [1, 2, 3, 4]
    seen: set[str] = set()
    transcripts = {s: [json.loads(x) for x in trainer.run.samples_path(s).read_text().splitlines()] for s in metrics}
    for step, m in sorted(metrics.items()):
        (problem,) = {rec["problem"] for rec in transcripts[step]}
        with_kernel = sum(1 for rec in transcripts[step] for t in rec["turns"] if t["status"] != "format_error")
        new = 1 if with_kernel and problem not in seen else 0
        seen |= {problem} if with_kernel else set()
        assert m["eval/evaluated"] == new, step
        assert m["eval/cache_hits"] == with_kernel - new, step
        assert m["time/eval_sum_s"] == pytest.approx(new * eval_s, abs=0.25), step
    assert pool.calls == len(seen)
    # The overlap is real: rollouts of steps 2-4 ran while the learner trained.
    assert sum(m["time/rollout_eval_s"] for s, m in metrics.items() if s > 1) < 0.5 * 3 * learn_s


def test_verdict_cache_is_bounded():
    async def main():
        cache = VerdictCache(max_entries=3)
        for i in range(5):
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(i)
            cache.store("p", f"code {i}", fut)
        return cache

    cache = asyncio.run(main())
    assert len(cache) == 3 and cache.lookup("p", "code 0") is None and cache.lookup("p", "code 4") is not None


def _learner_proc(cfg, tmp_path, fault="", at=0):
    from kforge.train.learner_proc import LearnerProcess

    return LearnerProcess(cfg, "", factory="fake_parts:FakeLearnerService", factory_kwargs={"fault": fault, "at": at},
                          log_path=str(tmp_path / f"learner-{fault or 'ok'}.log"), start_timeout_s=120)


@pytest.mark.parametrize("fault", ["hang", "die"])
def test_a_hung_or_dead_learner_fails_the_run_within_its_deadline_and_resume_continues(tmp_path, fault):
    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    cfg.learner.call_timeout_s = 3.0
    learner = _learner_proc(cfg, tmp_path, fault, at=2)
    trainer = make_trainer(tmp_path, cfg, learner, FakePool())
    t0 = time.monotonic()
    try:
        with pytest.raises(Exception) as info:
            asyncio.run(trainer.run_async())
        took = time.monotonic() - t0
    finally:
        learner.close()
    status = trainer.run.read_status()
    assert status["status"] == "failed" and trainer.step == 1
    if fault == "hang":
        assert "did not answer train_step within 3 s" in status["error"] and took < 3.0 + 4.0
    else:
        assert "exit code 7" in str(info.value) and "illegal memory access" in str(info.value)
        assert took < 3.0 + 2.0  # noticed when the process died, not at the deadline
    assert trainer.run.last_checkpoint()["step"] == 1  # nothing half-trained was saved
    assert not learner._proc._proc.is_alive()

    healthy = _learner_proc(cfg, tmp_path)
    try:
        resumed = make_trainer(tmp_path, cfg, healthy, FakePool(), run=trainer.run)
        resumed.restore(trainer.run.path / trainer.run.last_checkpoint()["path"])
        assert resumed.step == 1 and healthy.version == 1
        assert asyncio.run(resumed.run_async()) == "finished"
    finally:
        healthy.close()
    assert trainer.run.read_status()["status"] == "finished"
    assert sorted(m["step"] for m in trainer.run.metrics()) == [1, 2, 3, 4]


def test_transcripts_are_capped_and_shown_per_problem_and_per_level_metrics_logged(tmp_path):
    from typer.testing import CliRunner

    from kforge.cli.app import app

    cfg = make_cfg(samples_max_mb=0.0015, per_level_metrics=True)  # ~1.5 kB: room for a few trajectories
    cfg.dataset.epochs = 1
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool())
    assert asyncio.run(trainer.run_async()) == "finished"
    m = trainer.run.metrics()[0]
    level = trainer.levels[trainer.train_problems[0].key]
    assert m[f"level{level}/reward/mean"] == pytest.approx(m["reward/mean"])  # one level in this run
    assert m[f"level{level}/rate/correct"] == m["rate/correct"]
    lines = [json.loads(x) for x in trainer.run.samples_path(1).read_text().splitlines()]
    assert "truncated" in lines[-1] and lines[-1]["truncated"] == 4 - (len(lines) - 1)
    rec = lines[0]
    turn = rec["turns"][0]
    assert {"prompt_sha", "response", "status", "score", "advantage", "return", "reward_components"} <= set(turn)
    problem = rec["problem"]
    out = CliRunner().invoke(app, ["runs", "show", str(trainer.run.path), "--step", "1", "--problem", problem])
    assert out.exit_code == 0, out.output
    assert problem in out.output and "advantage" in out.output
    bad = CliRunner().invoke(app, ["runs", "show", str(trainer.run.path), "--step", "9"])
    assert bad.exit_code == 2 and "no transcript for step 9" in bad.output


def test_a_stalled_stage_says_what_it_waits_for_and_a_verdict_has_a_deadline(tmp_path, caplog):
    """Nothing moves in the rollout stage while a verdict is outstanding: within log.stall_warn_s the log
    (and the dashboard) name the stage and what it waits for; past evaluator.verdict_timeout_s the step
    fails with the stage named, rather than waiting for ever."""
    cfg = make_cfg(stall_warn_s=0.3)
    cfg.rollout.max_staleness = 0
    cfg.evaluator.verdict_timeout_s = 1.5
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool(eval_s=30.0))
    caplog.set_level("WARNING", logger="kforge.train")
    t0 = time.monotonic()
    with pytest.raises(Exception, match="no verdict for a .* candidate within 1.5 s"):
        asyncio.run(trainer.run_async())
    assert time.monotonic() - t0 < 20
    stalls = [r.getMessage() for r in caplog.records if "has not moved" in r.getMessage()]
    assert stalls and "step 1: rollout + eval" in stalls[0] and "1 verdict(s) from the eval pool" in stalls[0]
    assert "0 generation(s)" in stalls[0]
    assert trainer.run.read_status()["status"] == "failed"
