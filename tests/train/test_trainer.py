"""The trainer's own logic: per-step statistics in pipelined mode, transcripts and stalls with stand-ins
for the model-backed parts (tests/support/fake_parts.py); a learner process that hangs or dies, and resume after
that failure, on the real learner process and the real eval pool (the rollout engine, vLLM on a GPU, is the
one stand-in there). The trainer, episode runner, verdict cache and run folder are always real."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from fake_parts import DeadEngine, FakeBuilder, FakeEngine, FakeLearner, FakePool
from kforge.config.loader import to_yaml
from kforge.policy.runner import EpisodeRunner, VerdictCache
from kforge.problems import builtin_problems
from kforge.rollout.base import BackendError
from kforge.runs.folder import RunFolder
from kforge.train.placement import Plan
from kforge.train.trainer import Parts, Trainer
from trainer_parts import SPLIT, Serial, make_cfg, make_trainer, one_sample


@pytest.mark.slow  # four pipelined steps of 0.8 s learner work
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


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A real causal LM small enough to start a learner process in seconds: built from a config, offline."""
    from bench.scratch_model import train_tokenizer, write_model_folder

    out = tmp_path_factory.mktemp("tiny-model")
    train_tokenizer(out, vocab_size=300, corpus_bytes=200_000)
    return write_model_folder(out, hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64, real_weights=True,
                              dtype="float32", tokenizer_from=out)


def _learner_proc(cfg, tmp_path, fault="", at=0):
    from kforge.train.learner_proc import LearnerProcess
    from tiny_models import learner_sampling

    return LearnerProcess(cfg, [], total_steps=4, sampling=learner_sampling(cfg), factory="fake_parts:FaultyLearner",
                          factory_kwargs={"fault": fault, "at": at},
                          log_path=str(tmp_path / f"learner-{fault or 'ok'}.log"), start_timeout_s=300)


@pytest.mark.slow  # a real learner process trains, hangs and dies: about 20 s
def test_a_hung_or_dead_learner_fails_the_run_within_its_deadline_and_resume_continues(tmp_path, tiny_model_dir):
    """The real learner process (a real Learner, real LoRA steps, real checkpoints) hangs at step 2: the run
    fails within learner.call_timeout_s and saves nothing half-trained. Resumed from step 1 on a fresh
    learner process, it trains on from the restored state until the process dies at its second optimiser
    step (a CUDA error's exit): the run fails as soon as the process is gone, with its last output, not at the deadline."""
    from kforge.evaluator import EvalPool

    cfg = make_cfg()
    cfg.model.name, cfg.model.dtype = str(tiny_model_dir), "float32"
    cfg.rollout.max_staleness = 0
    cfg.learner.call_timeout_s = 5.0
    with EvalPool(cfg.evaluator) as pool:
        run = None
        for fault in ("hang", "die"):
            learner = _learner_proc(cfg, tmp_path, fault, at=2)
            trainer = make_trainer(tmp_path, cfg, learner, pool, run=run)
            run = trainer.run
            try:
                if fault == "die":
                    trainer.restore(run.path / run.last_checkpoint()["path"])
                    assert trainer.step == 1 and learner.version == 1  # the learner's state after step 1
                t0 = time.monotonic()
                with pytest.raises(Exception) as info:
                    asyncio.run(trainer.run_async())
                took = time.monotonic() - t0
            finally:
                learner.close()
            status = run.read_status()
            assert status["status"] == "failed" and (fault == "die" or trainer.step == 1), status
            assert run.last_checkpoint()["step"] == trainer.step  # nothing half-trained was saved
            assert not learner.alive()
            if fault == "hang":
                assert "did not answer train_step within 5 s" in status["error"] and took < 5.0 + 5.0
            else:
                assert "exit code 7" in str(info.value) and "illegal memory access" in str(info.value)
                assert took < 5.0 + 5.0 and learner.version == 2  # one real optimiser step after the resume
                assert 2 <= trainer.step < 4  # it went on past the restored step
    assert sorted(m["step"] for m in run.metrics()) == list(range(1, trainer.step + 1))


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


def test_turns_are_scored_by_the_credit_step_from_their_verdicts(tmp_path):
    """The episode records verdicts; the trainer's credit step is the one writer of scores (the transcript
    and the reward metric show them)."""
    from kforge.credit.rewards import score_turn

    cfg = make_cfg()
    cfg.dataset.epochs = 1
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool())
    rollouts = asyncio.run(trainer.parts.runner.run_groups(trainer.train_problems[:1], 4, 0, seed=1))
    turns = [t for tr in rollouts.trajectories for t in tr.turns]
    assert {t.score for t in turns} == {0.0} and all(t.reward_components == {} for t in turns)
    trainer._credit(rollouts.trajectories)
    assert [t.score for t in turns] == [score_turn(t, cfg.reward, False)[0] for t in turns]
    assert len({t.score for t in turns}) == 2  # format errors and kernels scored apart: a signal to learn from


def test_a_restarted_rollout_backend_is_held_in_one_place(tmp_path):
    """A rollout worker that fails is replaced once, where the runner holds it: the next rollouts and the
    closing of the parts both reach the new one."""
    fresh = FakeEngine()
    fresh.close = lambda: setattr(fresh, "closed", True)
    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool())
    dead = trainer.parts.runner.backend = DeadEngine()
    trainer.parts.restart_backend = lambda: fresh
    rollouts = asyncio.run(trainer._rollouts(1, trainer.train_problems[:1]))
    assert dead.closed and trainer.restarts == 1 and len(rollouts.trajectories) == 4
    assert trainer.parts.backend is fresh and trainer.parts.runner.backend is fresh and fresh.version == 0
    trainer.parts.close()
    assert fresh.closed


@pytest.mark.slow  # starts a learner process on a scratch model
def test_the_learner_takes_the_runs_sampling_record(tmp_path, tiny_model_dir):
    """build_parts hands the learner the sampling settings the episodes sample with, as one record."""
    from kforge.rollout.base import sampling_from_config
    from kforge.train.build import build_parts

    cfg = make_cfg()
    cfg.model.name, cfg.model.dtype = str(tiny_model_dir), "float32"
    cfg.rollout.temperature, cfg.rollout.top_k, cfg.rollout.top_p, cfg.rollout.max_tokens = 0.7, 5, 0.9, 9
    parts = build_parts(cfg, Plan([]), RunFolder.create(tmp_path, "s", to_yaml(cfg)), total_steps=1)
    try:
        assert parts.learner.sampling == sampling_from_config(cfg)
        assert (parts.learner.temperature, parts.learner.top_k, parts.learner.top_p) == (0.7, 5, 0.9)
        assert parts.backend is parts.runner.backend and parts.shares_model
    finally:
        parts.close()


def _two_checkpoints_the_newest_unloadable(tmp_path, marker: Path) -> tuple:
    """A tiny learner's run with checkpoints at steps 1 and 2, step 2's learner state planted so that loading it
    (never its format) fails: unpickled, it would create `marker`."""
    import torch

    from kforge.learner.checkpoint import STATE_FILE
    from tiny_models import Planted, make_learner, tiny_cfg, tiny_model

    cfg = tiny_cfg()
    cfg.episode.mode, cfg.dataset.test_fraction, cfg.log.tensorboard = "single_turn", 0.0, False
    trainer = make_trainer(tmp_path, cfg, make_learner(cfg, model=tiny_model()), FakePool())
    for step in (1, 2):
        trainer.step = trainer.parts.learner.version = step
        trainer.save_checkpoint("scheduled")
    planted = trainer.run.path / "checkpoints" / "step_000002" / "learner" / STATE_FILE
    torch.save({"rng": Planted(marker)}, planted)
    return cfg, trainer.run, planted


def test_resume_falls_back_past_a_checkpoint_whose_learner_state_does_not_load(tmp_path):
    """A learner state that passes the format checks (a whole zip) but is not plain data: resume names it,
    does not unpickle it, and continues from the checkpoint before; when none loads, set-up fails in one line."""
    import torch

    from kforge.learner.checkpoint import STATE_FILE
    from kforge.train.build import SetupError, restore_newest
    from tiny_models import Planted, make_learner, tiny_model

    marker = tmp_path / "unpickled"
    cfg, run, planted = _two_checkpoints_the_newest_unloadable(tmp_path, marker)
    assert run.last_checkpoint()["step"] == 2  # a whole file: only loading it shows what it holds

    said = []
    fresh = make_trainer(tmp_path, cfg, make_learner(cfg, model=tiny_model(1)), FakePool(), run=run)
    restore_newest(fresh, run, said.append)
    assert fresh.step == 1 and fresh.parts.learner.version == 1 and not marker.exists()
    assert len(said) == 1 and str(planted) in said[0] and "trying the one before it" in said[0]

    torch.save({"rng": Planted(marker)}, run.path / "checkpoints" / "step_000001" / "learner" / STATE_FILE)
    with pytest.raises(SetupError, match="no checkpoint of run r can be resumed from"):
        restore_newest(make_trainer(tmp_path, cfg, make_learner(cfg, model=tiny_model(2)), FakePool(), run=run), run,
                       said.append)
    assert not marker.exists()


@pytest.mark.parametrize("ends", ["stopped", "extension_fails"])
def test_a_resume_records_its_changes_after_the_step_it_restored_not_a_newer_one_that_did_not_load(tmp_path, caplog,
                                                                                                     clean_env, ends):
    """Step 2's learner state passes the format checks but does not load: the resume continues from step 1,
    and its changed settings were recorded and logged "after step 2" (config_history.jsonl's after_step), the
    step the format checks pointed at before the model loaded. They are recorded once the trainer is restored,
    with the layer that set each; an extension of a finished run that then fails is undone."""
    import contextlib
    import logging

    from kforge.train import build, lifecycle
    from tiny_models import make_learner, tiny_model

    cfg, run, _ = _two_checkpoints_the_newest_unloadable(tmp_path, tmp_path / "unpickled")
    run.set_status("finished" if ends == "extension_fails" else "stopped", step=2)
    config = run.config_path.read_bytes()

    clean_env.setenv("KFORGE_ROLLOUT__TOP_K", "5")
    target = lifecycle.resume_target(str(run.path), None, ["max_steps=5"])
    assert target.start == 2  # only loading step 2 shows what it holds
    said = []

    def build_trainer(cfg, run, plan, resumed):  # the real restore, on the tiny learner instead of the preset's
        fresh = make_trainer(tmp_path, cfg, make_learner(cfg, model=tiny_model(1)), FakePool(), run=run)
        build.restore_newest(fresh, run, said.append)
        return fresh

    @contextlib.contextmanager
    def end_at_once(trainer):  # the set-up is what this test is about: the loop ends as it would start
        raise KeyboardInterrupt if ends == "stopped" else RuntimeError("the rollout engine died")
        yield

    clean_env.setattr(build, "build_trainer", build_trainer)
    with caplog.at_level(logging.INFO, logger="kforge"):
        opened = lifecycle.open_run(target.resolved, target, said.append)
        outcome = lifecycle.drive(opened, SPLIT, end_at_once)
    record = run.config_history()[0]
    assert record["after_step"] == 1, record
    assert "resume after step 1 changes max_steps" in caplog.text and "after step 2" not in caplog.text, caplog.text
    assert len(said) == 1 and "step_000002" in said[0] and "trying the one before it, step 1" in said[0], said
    assert record["changes"] == {"max_steps": {"from": None, "to": 5, "by": "command line"},
                                 "rollout.top_k": {"from": cfg.rollout.top_k, "to": 5, "by": "env"}}
    if ends == "stopped":
        assert outcome.status == "stopped" and "max_steps: 5" in run.config_path.read_text()
        assert lifecycle.resume_target(str(run.path), None, ["max_steps=5"]).changes == {}  # the same again: none
    else:  # the run stays finished with the settings it finished with
        assert [r["event"] for r in run.config_history()] == ["resume", "undone"]
        assert run.config_path.read_bytes() == config and run.read_status()["status"] == "finished"


class _SlowWriter(FakeLearner):
    """Writing an adapter or a checkpoint takes `write_s` once training has begun (a big adapter, a slow disk)."""

    def __init__(self, write_s: float, what: str) -> None:
        super().__init__(step_s=0.05)
        self.write_s, self.what = write_s, what

    def save_adapter(self, path, dtype=None):
        if self.what == "adapter" and self.version >= 1:
            time.sleep(self.write_s)
        super().save_adapter(path, dtype)

    def save_checkpoint(self, path):
        if self.what == "checkpoint" and self.version >= 1:
            time.sleep(self.write_s)
        super().save_checkpoint(path)


# Each a few seconds of steps; the fast loop keeps the transcript's.
@pytest.mark.parametrize("what", [pytest.param("adapter", marks=pytest.mark.slow),
                                  pytest.param("checkpoint", marks=pytest.mark.slow), "transcript"])
def test_the_event_loop_keeps_serving_while_a_slow_write_runs(tmp_path, monkeypatch, what):
    """An adapter sync, a checkpoint or a transcript that takes 0.8 s must not hold the event loop: the
    next step's trajectories (pipelined) and anything else on the loop keep running meanwhile."""
    import kforge.train.trainer as trainer_mod

    write_s = 0.8
    if what == "transcript":
        real = trainer_mod.write_transcript

        def slow(*args, **kwargs):
            time.sleep(write_s)
            return real(*args, **kwargs)

        monkeypatch.setattr(trainer_mod, "write_transcript", slow)
    learner = _SlowWriter(write_s, what)
    trainer = make_trainer(tmp_path, make_cfg(), learner, FakePool(0.0))
    gaps: list[float] = []  # between the loop's turns, from the first train_step on (the writes are slow then)

    async def main():
        async def heartbeat():
            last, training = time.monotonic(), False
            while True:
                await asyncio.sleep(0.02)
                now = time.monotonic()
                if training:
                    gaps.append(now - last)
                last, training = now, learner.version >= 1

        beat = asyncio.ensure_future(heartbeat())
        t0 = time.monotonic()
        status = await trainer.run_async()
        beat.cancel()
        return status, time.monotonic() - t0

    status, wall = asyncio.run(main())
    assert status == "finished"
    assert wall >= 3 * write_s  # the slow writes really happened (at least one per step)
    assert max(gaps) < write_s / 2, max(gaps)
    metrics = trainer.run.metrics()
    if what == "adapter":  # the sync's parts are timed: here the learner's write is the slow part
        synced = [m for m in metrics if m["time/sync_s"] > 0]  # a step whose learner skipped syncs nothing
        assert synced and all(m["time/sync_save_s"] >= write_s and m["time/sync_load_s"] < write_s for m in synced)


def test_the_dashboard_shows_each_stage_while_it_runs_and_ends_on_the_last_step(tmp_path):
    """Pipelined, the next step's rollouts run while this step learns: both show. The optimiser step's stage
    ends with it (the sync, held-out eval and checkpoint after it show as themselves, not as `learn`), and the
    run ends on its last step done, with no stage left under way."""
    from io import StringIO

    from rich.console import Console

    from kforge.ui.dashboard import Dashboard

    class Recording(Dashboard):
        def _refresh(self) -> None:
            seen.append({name: tuple(s) for name, s in self.stages.items()})

    seen: list[dict] = []
    cfg = make_cfg(eval_every=2)
    problems = builtin_problems()[:3]
    runner = EpisodeRunner(FakeEngine(), FakeBuilder(problems), FakePool(0.2).evaluate, cfg, VerdictCache())
    trainer = Trainer(cfg, RunFolder.create(tmp_path, "r", to_yaml(cfg)), SPLIT, problems[:2], problems[2:],
                      Parts(FakeLearner(step_s=0.5), FakePool(0.2), runner, shares_model=False))
    with Recording(Console(file=StringIO(), width=200), "r", trainer.total_steps, "p", live=False) as dash:
        trainer.dashboard = dash
        assert asyncio.run(trainer.run_async()) == "finished"
    assert any({"learn", "rollout + eval"} <= set(stages) for stages in seen)  # the overlap, both shown
    assert any(stages.get("held-out eval", (0,))[0] == 1 for stages in seen)  # its own stage, with progress
    for stages in seen:
        assert not ({"learn"} & set(stages) and {"sync adapter", "held-out eval", "checkpoint"} & set(stages)), stages
        assert all(total == 0 or done <= total for done, total, _ in stages.values()), stages
    assert dash.stages == {} and dash.idle == f"step {trainer.total_steps} done"


def test_a_run_writes_its_engine_copies_to_shm_and_removes_them_at_the_end(tmp_path):
    from kforge.rollout import adapters

    learner = FakeLearner(step_s=0.0)
    trainer = make_trainer(tmp_path, make_cfg(), learner, FakePool(0.0))
    root = trainer._copies.root
    assert root.parent == adapters.SHM  # the conftest's stand-in for /dev/shm
    loaded: list[str] = []
    real = trainer.parts.backend.load_adapter
    trainer.parts.backend.load_adapter = lambda path, version: (loaded.append(path), real(path, version))[1]
    assert asyncio.run(trainer.run_async()) == "finished"
    assert loaded and all(Path(p).parent == root for p in loaded)
    assert not root.exists()  # removed at the end of the run
    assert not (trainer.run.path / "adapters").exists()


class Replica(FakeEngine):
    """An engine replica that notes whether it was awake at each generate call."""

    def __init__(self) -> None:
        super().__init__()
        self.asleep, self.awake_at_generate, self.sleeps = False, [], 0

    async def agenerate(self, requests, on_completion=None):
        self.awake_at_generate.append(not self.asleep)
        return await super().agenerate(requests, on_completion)

    def sleep(self):
        time.sleep(0.02)  # a measurable cost, which the step's metrics must show
        self.asleep, self.sleeps = True, self.sleeps + 1

    def wake(self):
        time.sleep(0.02)
        self.asleep = False


@pytest.mark.parametrize("colocated", [True, False], ids=["colocated", "split"])
def test_colocated_replicas_all_sleep_through_the_learner_step_and_wake_for_rollouts(tmp_path, colocated):
    """Two GPUs, each an engine replica and a learner rank: every replica is asleep while the learner
    trains (its rank needs the GPU's memory) and awake for every rollout; a split plan never sleeps them."""
    from kforge.rollout.replicas import Replicas

    engines = [Replica(), Replica()]

    class Learner(FakeLearner):
        def train_step(self, samples):
            self.asleep_during = getattr(self, "asleep_during", []) + [[e.asleep for e in engines]]
            return super().train_step(samples)

    cfg = make_cfg(save_every=0)
    cfg.rollout.max_staleness = 0  # one problem a step: the router gives the second one the other replica
    plan = Plan(["0", "1"], [0, 1], [0, 1], [0, 1]) if colocated else Plan(["0", "1"], [0], [1], [1])
    problems, pool, learner = builtin_problems()[:2], FakePool(), Learner()
    runner = EpisodeRunner(Replicas(engines), FakeBuilder(problems), pool.evaluate, cfg, VerdictCache())
    trainer = Trainer(cfg, RunFolder.create(tmp_path, "c", to_yaml(cfg)), plan, problems, [],
                      Parts(learner, pool, runner, shares_model=False))
    assert plan.mode == ("colocated" if colocated else "split") and not trainer.pipelined
    assert asyncio.run(trainer.run_async()) == "finished" and trainer.step == 4
    learned = len(learner.trained)  # a step whose groups all tie has no learner step (nor a sleep)
    assert learned >= 2 and learner.asleep_during == [[colocated, colocated]] * learned
    assert all(e.awake_at_generate and all(e.awake_at_generate) for e in engines)  # both served, always awake
    assert [e.sleeps for e in engines] == [learned if colocated else 0] * 2 and not any(e.asleep for e in engines)
    records = [json.loads(line) for line in (trainer.run.path / "metrics.jsonl").read_text().splitlines()]
    for key in ("time/sleep_s", "time/wake_s"):  # the engines' sleep and wake are each a timed stage
        assert sum(r[key] >= 0.02 for r in records) == (learned if colocated else 0)
        assert all(r[key] == 0.0 for r in records if r[key] < 0.02)


# ------------------------------------------------------------------ restarts of a rollout engine
class Mortal(FakeEngine):
    """One engine whose worker dies at the call named `dies_at` (then every call raises as a dead vLLM worker's
    does, and alive() says so); it notes each adapter it loads as (its version label, the version the folder
    holds) and whether it was closed."""

    def __init__(self, dies_at: str = "") -> None:
        super().__init__()
        self.dies_at, self.dead, self.closed, self.loaded = dies_at, False, False, []

    def alive(self):
        return not self.dead

    def _call(self, op):
        self.dead = self.dead or op == self.dies_at
        if self.dead:
            raise BackendError(f"vLLM worker process died during {op} (exit code -9)")

    async def agenerate(self, requests, on_completion=None):
        self._call("generate")
        return await super().agenerate(requests, on_completion)

    def load_adapter(self, path, version):
        self._call("load_adapter")
        self.loaded.append((version, json.loads((Path(path) / "adapter_config.json").read_text())["version"]))
        super().load_adapter(path, version)

    def sleep(self):
        self._call("sleep")

    def wake(self):
        self._call("wake")

    def close(self):
        self.closed = True


def test_pipelined_an_engine_restarted_while_the_learner_trains_gets_its_adapter_off_the_loop(tmp_path):
    """Split and pipelined, one engine: the next step's rollouts find it dead while the learner trains. It is
    started again off the event loop, given the adapter it had (version 0, from the folder written for
    version 0) without asking the busy learner for anything (so no learner deadline runs behind its step),
    and the rollouts are redone under version 0; the sync after the step gives the fresh engine version 1."""
    from kforge.train.data import seed_everything
    from kforge.train.trainer import StepTimes

    hold = threading.Event()  # the learner's step lasts until the engine is restarted
    learner, dead, fresh, restarted = Serial(hold=hold), Mortal(), Mortal(), []

    def restart_backend():
        try:
            asyncio.get_running_loop()
            restarted.append("on the event loop")
        except RuntimeError:
            restarted.append("in a thread" if learner.training else "after the learner's step")
        hold.set()
        return fresh

    trainer = make_trainer(tmp_path, make_cfg(), learner, FakePool())
    assert trainer.pipelined
    trainer.parts.runner.backend, trainer.parts.restart_backend = dead, restart_backend
    trainer._sync_adapter()  # as a run starts: version 0 to the engine
    seed_everything(0)  # a step's rollouts start with it; its first call imports torch (seconds)

    async def main():
        learning = asyncio.ensure_future(trainer._learn_step(one_sample(), StepTimes()))
        while not learner.training:
            await asyncio.sleep(0.01)
        dead.dead = True  # the next step's rollouts meet a dead engine while the learner trains
        rollouts = await trainer._rollouts(2, trainer.train_problems[:1])
        await learning
        await trainer._off_loop(trainer._sync_adapter)
        return rollouts

    rollouts = asyncio.run(main())
    assert restarted == ["in a thread"] and dead.closed and trainer.restarts == 1
    assert learner.saved_in_step == [False, False]  # the start's copy and the sync's: none behind a train step
    assert fresh.loaded == [(0, 0), (1, 1)]  # each label with the weights it names, each folder its own
    assert all(t.turns[0].policy_version == 0 for t in rollouts.trajectories) and len(rollouts.trajectories) == 4


@pytest.mark.parametrize("dies_at", ["sleep", "wake", "load_adapter"])
def test_an_engine_that_dies_asleep_or_in_the_sync_is_restarted_after_the_learners_step(tmp_path, dies_at):
    """One GPU, colocated: the engine dies as it is put to sleep, while asleep (its wake fails) or as it loads
    the new adapter. It is started again (not the run failed), and never while the learner trains on its GPU:
    found dead by the sleep, it starts after the learner's step. The fresh engine gets the adapter it had, then
    the step's."""
    from kforge.train.trainer import StepTimes

    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    learner, engine, fresh, starts = Serial(), Mortal(), Mortal(), []
    trainer = make_trainer(tmp_path, cfg, learner, FakePool())
    trainer.plan = Plan(["0"], rollout=[0], learner=[0], eval=[0])
    trainer.parts.runner.backend = engine
    trainer.parts.restart_backend = lambda: (starts.append((learner.training, len(learner.trained))), fresh)[1]
    assert trainer.plan.mode == "colocated"
    trainer._sync_adapter()  # version 0
    engine.dies_at = dies_at
    asyncio.run(trainer._learn_step(one_sample(), StepTimes()))
    trainer._sync_adapter()  # version 1
    assert starts == [(False, 1)] and engine.closed and trainer.restarts == 1
    assert fresh.loaded == ([(1, 1)] if dies_at == "load_adapter" else [(0, 0), (1, 1)]) and fresh.version == 1



def test_a_failed_checkpoint_write_is_said_once_and_not_retried(tmp_path, caplog, monkeypatch):
    """The failure was the checkpoint (a full disk): it was written again "after the failure" and warned
    "could not save a checkpoint after the failure"; then the save's failure was said twice, by the trainer
    (its step, the checkpoint --resume continues from) and by the run's lifecycle (the disk's reason, the fix).
    Now one line says both, in the log and as the run's error, and the checkpoint is not written again."""
    import contextlib
    import logging

    from kforge.train import build, lifecycle

    class FullDisk(FakeLearner):
        saves: list[int] = []

        def save_checkpoint(self, path):
            self.saves.append(self.version)
            if self.version >= 1:
                raise OSError(28, "No space left on device", str(path))
            Path(path).mkdir(parents=True)  # a state alone: a checkpoint that can be resumed from
            (Path(path) / "state.json").write_text(json.dumps({"version": self.version}))

    learner = FullDisk(step_s=0.0)
    trainer = make_trainer(tmp_path, make_cfg(), learner, FakePool(0.0))
    monkeypatch.setattr(build, "build_trainer", lambda *args: trainer)
    with caplog.at_level(logging.INFO, logger="kforge"):
        outcome = lifecycle.drive(lifecycle.OpenRun(trainer.run, trainer.cfg, resumed=False), SPLIT,
                                  lambda trainer: contextlib.nullcontext(trainer.dashboard))
    run = trainer.run
    line = (f"saving the checkpoint of step 1 failed: cannot write in {run.path / 'checkpoints'}: No space left on "
            f"device; free space or fix its rights there, then kforge train --resume {run.path} (it continues from "
            "checkpoints/step_000000)")
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [line], said  # once, and never "could not save a checkpoint after the failure"
    assert learner.saves == [0, 1]  # not written again after the failure
    assert outcome.status == "failed" and outcome.error == line and run.read_status()["error"] == line
    assert run.last_checkpoint()["step"] == 0


def test_a_stop_asked_during_start_up_stops_the_run_and_an_old_stop_file_does_not(tmp_path):
    import os

    import psutil

    from kforge.runs.layout import STOP_FILE

    def run_with_stop(folder: str, written: float) -> tuple[str, RunFolder]:
        cfg = make_cfg()
        cfg.dataset.epochs = 1
        trainer = make_trainer(tmp_path / folder, cfg, FakeLearner(), FakePool())
        stop = trainer.run.path / STOP_FILE
        stop.write_text("{}\n")  # as `kforge runs stop` leaves it
        os.utime(stop, (written, written))
        return asyncio.run(trainer.run_async()), trainer.run

    # `runs stop` while a resume runs its pre-flight (the run shows "starting"): for this start.
    status, run = run_with_stop("asked", time.time())
    assert status == "stopped" and not run.metrics()
    # A STOP file from before this process started (a crash left it): an earlier start's, dropped.
    status, run = run_with_stop("old", psutil.Process().create_time() - 60.0)
    assert status == "finished" and run.metrics() and not (run.path / STOP_FILE).exists()
