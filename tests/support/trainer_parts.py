"""A real Trainer around the stand-ins of tests/support/fake_parts.py (engine, prompt builder, pool, learner): its
config, its construction, and a learner stand-in that runs one call at a time as the learner process does.
The trainer tests and the replica tests build their trainers here."""

from __future__ import annotations

import threading
import time

from fake_parts import FakeBuilder, FakeEngine, FakeLearner
from kforge.config.loader import to_yaml
from kforge.config.schema import KforgeConfig
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
    runner = EpisodeRunner(engine, FakeBuilder(problems), pool.evaluate, cfg, VerdictCache())
    run = run or RunFolder.create(tmp_path, name, to_yaml(cfg))
    return Trainer(cfg, run, SPLIT, problems, [], Parts(learner, pool, runner, shares_model=False))


class Serial(FakeLearner):
    """A learner that, like the learner process, runs one call at a time: a save asked during its train step
    runs after it (noted in `saved_in_step`); `spans` holds each train step's (start, end). With `hold`, a
    train step lasts until that event is set."""

    def __init__(self, step_s: float = 0.0, hold: threading.Event | None = None) -> None:
        super().__init__(step_s)
        self.lock, self.training, self.saved_in_step, self.spans = threading.Lock(), False, [], []
        self.hold = hold

    def train_step(self, samples):
        with self.lock:
            self.training, t0 = True, time.monotonic()
            try:
                assert self.hold is None or self.hold.wait(10)
                return super().train_step(samples)
            finally:
                self.training = False
                self.spans.append((t0, time.monotonic()))

    def save_adapter(self, path, dtype=None):
        self.saved_in_step.append(self.training)
        with self.lock:
            super().save_adapter(path, dtype)


def one_sample():
    """A batch of one sample of policy version 0, for a learner stand-in that only counts."""
    from types import SimpleNamespace

    return [SimpleNamespace(policy_version=0)]
