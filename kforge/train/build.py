"""Everything a run needs, built in one place from the config: problems and their split, the eval pool,
the learner (in-process on a CPU, its own process on GPUs), the rollout backend, the episode runner and
the trainer. The run's lifecycle (train/lifecycle.py) calls `build_trainer` and drives what it returns."""

from __future__ import annotations

import logging
from typing import Callable

from kforge.config.schema import KforgeConfig
from kforge.errors import UserError
from kforge.runs.folder import RunFolder, checkpoint_step
from kforge.train.placement import Plan
from kforge.train.trainer import Parts, Trainer

log = logging.getLogger("kforge.train")


class SetupError(UserError):
    """The run cannot start as configured; the message is one line for the user."""


def build_trainer(cfg: KforgeConfig, run: RunFolder, plan: Plan, resume: bool,
                  say: Callable[[str], None] = log.info) -> Trainer:
    """The trainer of `run`, restored from its last checkpoint when `resume`. The caller closes
    `trainer.parts` when done (also when this raises after the parts were built: they are closed here)."""
    train_set, test_set = split(cfg)
    say(f"{len(train_set)} training and {len(test_set)} held-out problems from {cfg.dataset.source}")
    parts = build_parts(cfg, plan, run, planned_steps(cfg, train_set), say)
    try:
        trainer = Trainer(cfg, run, plan, train_set, test_set, parts)
        if resume:
            restore_newest(trainer, run, say)
        return trainer
    except BaseException:
        parts.close()
        raise


def restore_newest(trainer: Trainer, run: RunFolder, say: Callable[[str], None]) -> None:
    """The newest checkpoint that loads: its files were checked by format already, but bytes flipped inside
    a file show only when it is read; each one that fails is named and the one before it tried."""
    tried, usable = [], run.usable_checkpoints()
    for ckpt, older in zip(usable, [*usable[1:], None]):
        try:
            trainer.restore(ckpt)
            return
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            if not getattr(trainer.parts.learner, "alive", lambda: True)():
                raise  # the learner process died: no other checkpoint would fare better
            tried.append(ckpt.name)
            then = f"trying the one before it, step {checkpoint_step(older)}" if older else "no older one is left"
            say(f"warning: cannot resume from {ckpt}: {(str(exc).splitlines() or [''])[0]}; {then}")
    damaged = run.damaged_checkpoints()
    if tried or damaged:
        raise SetupError(f"no checkpoint of run {run.name} can be resumed from"
                         + (f" (tried {', '.join(tried)})" if tried else f": {damaged[0]}"))


def split(cfg: KforgeConfig) -> tuple[list, list]:
    """The run's training and held-out problems."""
    from kforge.problems import problems_from_config, split_problems

    # A source, selection or fraction that cannot work is a ProblemSourceError: the user's one line as it is.
    train_set, test_set = split_problems(problems_from_config(cfg.dataset), cfg.dataset.test_fraction,
                                         cfg.dataset.seed)
    if not train_set:
        raise SetupError("the training split is empty: lower dataset.test_fraction or select more problems")
    return train_set, test_set


def planned_steps(cfg: KforgeConfig, train_set: list | None = None) -> int:
    """The steps the config asks for: its epochs over the training split, capped by max_steps."""
    from kforge.train.data import ProblemSampler

    total = ProblemSampler(train_set or split(cfg)[0], cfg.dataset.batch_size, cfg.dataset.epochs).total_steps
    return min(total, cfg.max_steps) if cfg.max_steps else total


def build_parts(cfg: KforgeConfig, plan: Plan, run: RunFolder, total_steps: int,
                say: Callable[[str], None] = log.info) -> Parts:
    from kforge.evaluator import EvalPool
    from kforge.evaluator.contention import GpuActivity
    from kforge.policy.runner import EpisodeRunner
    from kforge.rag import retriever_for
    from kforge.rollout.base import sampling_from_config
    from kforge.rollout.factory import choose_backend, make_backend

    activity = GpuActivity()  # the learner's steps and the engine's calls, for the pool's timed runs
    # The profiled share of GPU time costs a profiler start-up per candidate: measured for all only when used.
    uses_coverage = cfg.reward.coverage_scaled_speed or cfg.learner.min_coverage is not None
    evaluator = cfg.evaluator.model_copy(update={"coverage": True}) if uses_coverage else cfg.evaluator
    pool = EvalPool(evaluator, devices=plan.eval or None, activity=activity)
    learner = backend = None
    sampling = sampling_from_config(cfg)  # the learner scores tokens under what the engine sampled with
    try:
        if plan.mode == "cpu":
            from kforge.learner.learner import Learner
            from kforge.rollout.hf import HFBackend

            say("loading the model (CPU)")
            learner = Learner(cfg, device="cpu", total_steps=total_steps, sampling=sampling)
            backend = HFBackend.from_model(learner.model, learner.tokenizer, batch_size=cfg.rollout.hf_batch_size)
            restart = None
        else:
            from kforge.train.learner_proc import LearnerProcess

            say(f"starting the learner on GPU {plan.names('learner')}")
            # The learner first: colocated, its weights are resident when an engine sizes itself, and vLLM
            # refuses to start when less than its share (rollout.gpu_memory_utilization) is free, rather than
            # leaving a learner that starts later short (the planner checked that both fit).
            learner = LearnerProcess(cfg, plan.learner, total_steps, sampling=sampling, log_path=str(run.path / "learner.log"),
                                     reserve_gib=plan.learner_reserve_gib(cfg.evaluator.workers_per_gpu))
            engines = f"{plan.engines} rollout engines" if plan.engines > 1 else "the rollout engine"
            say(f"starting {engines} on GPU {plan.names('rollout')}")

            # The vLLM worker writes its own log; the hf backend runs in this process and has none.
            extra = {"log_path": str(run.path / "rollout.log")} if choose_backend(cfg.rollout.backend) == "vllm" else {}

            def restart():  # a fresh engine after a crash, on the same GPUs
                return make_backend(cfg, plan.rollout, plan.rollout_tp, **extra)

            backend = restart()
        if learner.recompute is not None:  # which layers recompute in backward, and why (an `auto` share's sizes)
            say(learner.recompute.why if learner.recompute.fits else f"warning: {learner.recompute.why}")
        runner = EpisodeRunner.from_config(cfg, backend, pool.evaluate, retriever_for(cfg.dataset))
        runner.engine_busy = lambda: activity.busy("rollout", plan.rollout)
    except BaseException:
        for part in (backend, learner, pool):
            if part is not None and hasattr(part, "close"):
                part.close()
        raise
    return Parts(learner, pool, runner, shares_model=plan.mode == "cpu", restart_backend=restart, activity=activity)

