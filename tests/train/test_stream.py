"""Continuous rollouts (rollout.mode=continuous, kforge/train/stream.py): the admission rule and the take rule
as pure functions, then the real trainer, episode runner and run folder with the stand-ins of
tests/support/fake_parts.py: versions per turn, stale groups dropped, no generation during a shared-GPU learner
step, resume; the config's refusals; one `kforge train` on the CPU with the tiny preset."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from fake_parts import FakeBuilder, FakeEngine, FakeLearner, FakePool
from kforge.config.loader import ConfigError, resolve, to_yaml
from kforge.config.schema import KforgeConfig
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.runner import EpisodeRunner, VerdictCache
from kforge.problems import builtin_problems
from kforge.runs.folder import RunFolder
from kforge.train.placement import Plan
from kforge.train.stream import Group, may_start, pick
from kforge.train.trainer import Parts, Trainer

SPLIT = Plan(["0", "1"], rollout=[0], learner=[1], eval=[1])
CPU = Plan([])


# -- the rules --------------------------------------------------------------------------------------------------
def _may(engine=5, learner=5, outstanding=0, in_flight=0, batch=2, staleness=1, cap=4):
    return may_start(engine_version=engine, learner_version=learner, outstanding=outstanding, in_flight=in_flight,
                     batch_size=batch, max_staleness=staleness, max_in_flight=cap)


def test_admission_keeps_every_group_within_the_staleness_bound_and_the_cap():
    # On the learner's version: this step's B and the next step's B may start (taken 0 and 1 versions later).
    assert [_may(outstanding=o) for o in range(5)] == [True, True, True, True, False]
    # While the learner makes version 6 from 5, the engine still samples 5: one batch less fits in the bound.
    assert [_may(learner=6, outstanding=o) for o in range(3)] == [True, True, False]
    assert [_may(staleness=2, outstanding=o, cap=9) for o in range(7)] == [True] * 6 + [False]
    assert not _may(in_flight=4, outstanding=4, staleness=3)  # the cap on groups in flight
    assert not _may(engine=3, learner=5, staleness=1)  # an engine behind the bound starts nothing
    assert _may(engine=4, learner=5, staleness=1)


def _group(seq, version):
    return Group(seq, builtin_problems()[0], version)


def test_the_learner_takes_the_oldest_start_version_first_and_drops_groups_past_the_bound():
    done = [_group(7, 5), _group(3, 5), _group(9, 4), _group(1, 3), _group(2, 5)]
    taken, stale = pick(done, learner_version=5, max_staleness=1, batch_size=3)
    assert [g.seq for g in taken] == [9, 2, 3]  # version 4 first, then draw order among version 5
    assert [g.seq for g in stale] == [1]  # 2 versions behind a bound of 1
    taken, stale = pick(done, learner_version=5, max_staleness=2, batch_size=2)
    assert [g.seq for g in taken] == [1, 9] and stale == []


# -- the config -------------------------------------------------------------------------------------------------
def test_continuous_mode_takes_a_larger_bound_and_refuses_an_unclipped_loss_past_one_version():
    cfg = resolve("tiny", overrides=["rollout.mode=continuous", "rollout.max_staleness=3"]).config
    assert cfg.rollout.max_staleness == 3 and not cfg.rollout.pipelined
    for loss in ("importance_sampling", "nll"):
        with pytest.raises(ConfigError, match=rf"learner.loss_fn \(from command line\): {loss} has no clipped "
                                              r"importance ratio.*rollout.max_staleness=2") as info:
            resolve("tiny", overrides=["rollout.mode=continuous", "rollout.max_staleness=2", f"learner.loss_fn={loss}"])
        assert "\n" not in str(info.value)
    assert resolve("tiny", overrides=["rollout.mode=continuous", "rollout.max_staleness=1",
                                      "learner.loss_fn=importance_sampling"]).config.rollout.mode == "continuous"
    with pytest.raises(ConfigError, match=r"rollout.max_staleness .*continuous mode needs rollout.max_staleness=1"):
        resolve("tiny", overrides=["rollout.mode=continuous"])
    with pytest.raises(ConfigError, match=r"use 0 \(on-policy\) or 1 \(pipelined\), or rollout.mode=continuous"):
        resolve("tiny", overrides=["rollout.max_staleness=2"])


# -- the trainer ------------------------------------------------------------------------------------------------
def make_cfg(turns=1, batch=2, group=4, staleness=1, steps=None) -> KforgeConfig:
    cfg = KforgeConfig()
    cfg.episode.mode = "multi_turn" if turns > 1 else "single_turn"
    cfg.episode.max_turns = max(turns, 1)
    cfg.dataset.batch_size, cfg.dataset.group_size, cfg.dataset.epochs = batch, group, 2
    cfg.dataset.test_fraction = 0.0
    cfg.rollout.mode = "continuous"
    cfg.rollout.max_staleness = staleness
    cfg.log.tensorboard, cfg.log.save_every, cfg.max_steps = False, 1, steps
    return cfg


class SlowPool(FakePool):
    """Verdicts for the problems in `slow` take `slow_s`, the others `eval_s`."""

    def __init__(self, eval_s=0.02, slow=(), slow_s=0.0):
        super().__init__(eval_s)
        self.slow, self.slow_s = set(slow), slow_s

    async def evaluate(self, problem, code, backend):
        self.calls += 1
        await asyncio.sleep(self.slow_s if problem.key in self.slow else self.eval_s)
        return Verdict(Status.INCORRECT, feedback="wrong")


class TimedEngine(FakeEngine):
    """Records the intervals of its calls. A kernel differs from problem to problem by a constant (no template),
    so a group whose seeds differ in parity has different rewards: the learner takes real steps."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[float, float]] = []

    async def agenerate(self, requests, on_completion=None):
        t0 = time.monotonic()
        try:
            outs = await super().agenerate(requests)
            for i, (request, out) in enumerate(zip(requests, outs)):
                out.text = out.text.replace("return x", f"return x + {request.prompt_ids[0]}")
                if on_completion is not None:
                    on_completion(i, out)
            return outs
        finally:
            self.calls.append((t0, time.monotonic()))


class TimedLearner(FakeLearner):
    def __init__(self, step_s):
        super().__init__(step_s)
        self.steps: list[tuple[float, float]] = []
        self.sample_versions: list[list[int]] = []

    def train_step(self, samples):
        t0 = time.monotonic()
        self.sample_versions.append([s.policy_version for s in samples])
        out = super().train_step(samples)
        self.steps.append((t0, time.monotonic()))
        return out


def make_trainer(tmp_path, cfg, plan=SPLIT, pool=None, learner=None, n_problems=6, run=None, name="r"):
    problems = builtin_problems()[:n_problems]
    engine = TimedEngine()
    pool = pool or SlowPool()
    runner = EpisodeRunner(engine, FakeBuilder(problems), pool.evaluate, cfg, VerdictCache(max_entries=0))
    run = run or RunFolder.create(tmp_path, name, to_yaml(cfg))
    learner = learner or TimedLearner(0.05)
    return Trainer(cfg, run, plan, problems, [], Parts(learner, pool, runner, shares_model=False))


def _record_takes(trainer):
    """The trajectories of every take, with the learner's version at it."""
    takes = []
    take = trainer.stream._take

    async def recording():
        version = trainer.parts.learner.version
        rollouts = await take()
        takes.append((version, rollouts.trajectories))
        return rollouts

    trainer.stream._take = recording
    return takes


def test_each_turn_keeps_the_version_that_sampled_it_and_groups_flow_across_steps(tmp_path):
    """Three-turn chains on a split placement: a chain that crosses a learner step and its adapter sync
    samples its later turns with the newer adapter, and says so turn by turn; every step trains B whole
    groups, none older than the bound, and reports the stream's metrics."""
    cfg = make_cfg(turns=3, staleness=2, steps=5)
    trainer = make_trainer(tmp_path, cfg, learner=TimedLearner(0.05), pool=SlowPool(eval_s=0.25))
    takes = _record_takes(trainer)
    assert asyncio.run(trainer.run_async()) == "finished"
    assert len(takes) == 5
    crossed = 0
    for version, trajectories in takes:
        assert len({(t.problem_key, t.group_index) for t in trajectories}) == len(trajectories) == 2 * 4
        for traj in trajectories:
            versions = [t.policy_version for t in traj.turns]
            assert versions == sorted(versions) and version - versions[0] <= 2
            crossed += versions[0] != versions[-1]
    assert crossed, "no chain crossed an adapter sync"
    metrics = {m["step"]: m for m in trainer.run.metrics()}
    assert sorted(metrics) == [1, 2, 3, 4, 5]
    for m in metrics.values():
        for key in ("stream/groups_in_flight", "stream/groups_dropped_stale", "time/wait_groups_s",
                    "stream/group_age_max", "stream/group_age_mean"):
            assert key in m, key
    assert any(m["stream/group_age_max"] >= 1 for m in metrics.values())  # groups started on older adapters
    # The learner's samples carry their turn's version: the staleness it reports is per turn.
    assert any(len(set(v)) > 1 for v in trainer.parts.learner.sample_versions)


def test_a_group_past_the_bound_is_dropped_and_counted(tmp_path):
    """One problem's verdicts take longer than several learner steps: its group would complete more than
    max_staleness versions behind the learner, so it never reaches a batch (cancelled once it cannot be
    taken in time, and counted); the others go on meanwhile and every step trains groups within the bound."""
    problems = builtin_problems()[:6]
    cfg = make_cfg(batch=1, group=4, staleness=2, steps=8)
    slow = {problems[0].key}
    pool = SlowPool(eval_s=0.01, slow=slow, slow_s=4.0)
    trainer = make_trainer(tmp_path, cfg, pool=pool, learner=TimedLearner(0.05))
    takes = _record_takes(trainer)
    assert asyncio.run(trainer.run_async()) == "finished"
    assert len(takes) == 8
    started_slow = [s for s in trainer.stream.started if trainer.sampler.problem_at(s).key in slow]
    assert started_slow, [trainer.sampler.problem_at(s).key for s in trainer.stream.started]
    taken = {t.problem_key for _, trajectories in takes for t in trajectories}
    assert not taken & slow
    assert all(version - t.turns[0].policy_version <= 2 for version, trs in takes for t in trs)
    metrics = trainer.run.metrics()
    total = metrics[-1]["stream/groups_dropped_stale_total"]
    assert total >= 1 and sum(m["stream/groups_dropped_stale"] for m in metrics) == total


@pytest.mark.parametrize("plan", [CPU, SPLIT], ids=["shared", "split"])
def test_generation_pauses_during_a_shared_learner_step_and_overlaps_a_split_one(tmp_path, plan):
    cfg = make_cfg(turns=2, steps=4)
    trainer = make_trainer(tmp_path, cfg, plan=plan, pool=SlowPool(eval_s=0.03), learner=TimedLearner(0.3))
    assert asyncio.run(trainer.run_async()) == "finished"
    engine_calls, steps = trainer.parts.backend.calls, trainer.parts.learner.steps
    overlapping = [(c, s) for c in engine_calls for s in steps if c[0] < s[1] and s[0] < c[1]]
    if plan is CPU:
        assert overlapping == []
    else:
        assert overlapping


def test_a_resumed_run_draws_the_same_problems_as_an_uninterrupted_one(tmp_path):
    """Cut after step 2 (its end checkpoint holds the groups drawn and not taken), resumed on a fresh
    trainer: the groups not taken are drawn again first, then the order goes on; no group is taken twice or
    skipped, and the steps take the problems the uninterrupted run took."""
    def run(name, steps, resume_from=None):
        cfg = make_cfg(batch=2, group=2, steps=steps)
        trainer = make_trainer(tmp_path, cfg, run=resume_from, name=name)
        if resume_from is not None:
            end = resume_from.checkpoints()[-1]  # the fake learner's adapter has no weights: taken as it is
            assert end["reason"] == "end" and end["step"] == 2
            trainer.restore(resume_from.path / end["path"])
        assert asyncio.run(trainer.run_async()) == "finished"
        return trainer

    whole = run("whole", 5)
    first = run("cut", 2)
    state = first.stream.state_dict()
    assert state["redo"] == sorted(set(first.stream.started) - {s for t in first.stream.taken for s in t})
    second = run("cut", 5, resume_from=first.run)
    assert second.stream.started[:len(state["redo"])] == state["redo"]
    taken = [s for t in first.stream.taken + second.stream.taken for s in t]
    assert len(taken) == len(set(taken)) == 10
    assert [whole.sampler.problem_at(i).key for i in range(20)] == [second.sampler.problem_at(i).key for i in range(20)]
    keys = lambda trainer, takes: [sorted(trainer.sampler.problem_at(s).key for s in t) for t in takes]  # noqa: E731
    assert keys(first, first.stream.taken) + keys(second, second.stream.taken) == keys(whole, whole.stream.taken)


# -- end to end -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_kforge_train_runs_continuous_mode_on_the_cpu(tmp_path):
    """The tiny preset (a real model, the hf backend, the Triton interpreter) in continuous mode on a CPU:
    engine calls pause while the in-process model trains; 2 steps, each with the stream's metrics."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", "kforge", "train", "--runs-dir", str(tmp_path), "--preset", "tiny",
                          "--plain", "--name", "cont", "--max-steps", "2", "rollout.max_tokens=32",
                          "rollout.mode=continuous", "rollout.max_staleness=1", "log.tensorboard=false"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run = RunFolder(tmp_path / "cont")
    assert run.read_status()["status"] == "finished"
    metrics = {m["step"]: m for m in run.metrics()}
    assert sorted(metrics) == [1, 2]
    for m in metrics.values():
        assert m["stream/groups_dropped_stale"] == 0 and "time/wait_groups_s" in m and "staleness/max" in m or \
            m.get("learner/skipped") == 1.0
        assert m["length/response_tokens/mean"] > 0
