"""The training loop: rollouts -> credit -> learn -> sync -> log -> checkpoint, step after step.

`build_trainer` (train/build.py) builds the parts; this module only drives them. One step reads top to
bottom in `run_async`. With `rollout.max_staleness >= 1` and a split placement, the next step's rollouts
start while the learner trains (their own `RolloutStats` travel with them, so no step's numbers leak into
another's); the learner corrects the lag with the rollout log-probs. With `rollout.mode=continuous` a step takes the first
B GRPO groups that completed instead, and new groups keep starting (train/stream.py).

Determinism: every step's rollouts are seeded from (seed, step), and every generation request from
(step seed, problem, group, turn), so a resumed run redoes the steps after its last checkpoint with the
same problems and samples.

The event loop is never held by a write: the adapter sync, checkpoints and transcripts run in threads
(the learner's own thread for what touches the learner), so the next step's trajectories whose verdicts
came back send their next turn meanwhile.

Failure: a dead or hung learner (its calls have a deadline), a rollout worker that fails twice (a dead one is
restarted off the loop: `train/engine.py`), or any error ends the run as `failed` with the reason in
status.json; when the learner's state is still sound (it was not in the middle of a step) a checkpoint is
saved first. `--resume` continues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

from kforge.config.schema import KforgeConfig
from kforge.policy.records import Trajectory, Turn
from kforge.policy.runner import Rollouts
from kforge.problems.record import Problem
from kforge.rollout.adapters import EngineCopies
from kforge.rollout.base import BackendError
from kforge.runs.folder import ADAPTERS_DIR, LEARNER_DIR, RunFolder, read_trainer_state
from kforge.runs.transcripts import write_transcript
from kforge.space import run_write_failure
from kforge.train.data import ProblemSampler, seed_everything, step_seed
from kforge.train.engine import RolloutEngine
from kforge.train.gpu import PeakMemory
from kforge.train.metrics import MetricSinks, StepTimes, collapse_warnings, held_out_metrics, step_metrics
from kforge.train.parts import Parts
from kforge.train.placement import Plan
from kforge.train.stall import cancel, watched
from kforge.train.stopflag import StopFlag, drop_stale_stop
from kforge.train.stream import GroupStream
from kforge.ui.null import NullDashboard

T = TypeVar("T")
log = logging.getLogger("kforge.train")
ROLLOUTS = "rollout + eval"  # the dashboard's name for a step's rollouts and their evaluation


@dataclass
class Trainer:
    cfg: KforgeConfig
    run: RunFolder
    plan: Plan
    train_problems: list[Problem]
    test_problems: list[Problem]
    parts: Parts
    dashboard: Any = field(default_factory=NullDashboard)  # kforge train's Dashboard, or one showing nothing
    step: int = 0
    sampler: ProblemSampler = field(init=False)
    _stop: StopFlag = field(default_factory=StopFlag)
    _history: list[dict[str, Any]] = field(default_factory=list)
    _sampler_after: dict[int, dict[str, int]] = field(default_factory=dict)
    _synced_version: int | None = None
    _learning: bool = False
    _saving: bool = False  # stays set when a checkpoint's write raises: the failure was that checkpoint

    def __post_init__(self) -> None:
        ds = self.cfg.dataset
        self.sampler = ProblemSampler(self.train_problems, ds.batch_size, ds.epochs, ds.shuffle, ds.seed)
        self.levels = {p.key: p.level for p in self.train_problems + self.test_problems}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kforge-learn")
        backend = self.parts.backend  # None: a trainer without a runner (one that only checkpoints)
        self._copies = EngineCopies(self.run.path / ADAPTERS_DIR, dtype=backend.adapter_dtype if backend else None)
        self.engine = RolloutEngine(self.parts)  # hand-overs, sleep and wake, restarts: one at a time
        self.stream = GroupStream.of(self) if self.cfg.rollout.mode == "continuous" else None  # train/stream.py

    restarts = property(lambda self: self.engine.restarts)  # whole-backend restarts
    epoch = property(lambda self: self.stream.epoch if self.stream else self.sampler.epoch)

    @property
    def total_steps(self) -> int:
        planned = self.sampler.total_steps
        return min(planned, self.cfg.max_steps) if self.cfg.max_steps else planned

    @property
    def pipelined(self) -> bool:
        # Colocated, the engines sleep while the learner trains: only a split placement can overlap them.
        return self.cfg.rollout.pipelined and self.plan.mode == "split"

    # -- the loop -------------------------------------------------------------------------------------
    async def run_async(self) -> str:
        sinks = MetricSinks(str(self.run.path), self.cfg, resume_step=self.step)
        peaks = PeakMemory(self.plan).start()  # per role, over each step
        self._begin()
        status, pending = "finished", None  # pending: the next step's rollouts, started early
        try:
            while self.step < self.total_steps:
                if self._stop.requested or self.run.stop_requested():
                    status = "stopped"
                    break
                t0, step, times = time.time(), self.step + 1, StepTimes()
                rollouts = await self._watched(pending or self._start_rollouts(step), step, "rollout + eval",
                                               self._rollout_waits)  # 1. rollouts (+ evaluation)
                pending = None
                if rollouts is None:
                    break
                times.rollout_s = time.time() - t0
                samples, credit = self._credit(rollouts.trajectories)  # 2. credit: returns, advantages
                learning = asyncio.ensure_future(self._learn(samples, times))  # 3. learn, in a thread
                if self.pipelined and step < self.total_steps:
                    pending = self._start_rollouts(step + 1)  # on the current adapter, while it learns
                learned = await self._watched(learning, step, "learn", self._learner_waits)
                with self.dashboard.stage("sync adapter"):  # 4. the new adapter to the engine
                    times.sync_s = await self._off_loop(self._sync_adapter, None, times)
                self.step = step
                restarts = self.restarts + self.parts.backend.restarts  # + replicas restarted alone
                metrics = step_metrics(step, self.epoch, rollouts, credit, learned, times.__dict__,
                                       self.levels, self.cfg.log.per_level_metrics, restarts, self.plan)
                metrics.update(self.stream.last_metrics if self.stream else {})  # continuous: its take
                metrics.update(await self._watched(self._held_out(step), step, "held-out eval",
                                                   self._rollout_waits))  # 5. log (held-out eval on its cadence)
                with self.dashboard.stage("checkpoint"):  # 6. checkpoint on its schedule
                    metrics.update(await self._off_loop(self._scheduled_checkpoint, step))
                metrics.update(peaks.take())
                metrics["time/step_s"] = time.time() - t0
                await self._log(step, metrics, rollouts.trajectories, sinks)
            await self._cancel_rollouts(pending)
            await self._off_loop(self.save_checkpoint, "stop" if status == "stopped" else "end")
        except BaseException as exc:
            await self._cancel_rollouts(pending)
            status = "stopped" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "failed"
            why = {"error": self._failure(exc)} if status == "failed" else {"stopped_by": "signal"}
            self.run.set_status(status, step=self.step, **why)
            raise
        finally:
            self.engine.settle()  # a restart of cancelled rollouts ends first: its engine is closed with the parts
            sinks.close()
            peaks.stop()
            self._copies.close()  # what was written in /dev/shm (the engine has the weights loaded)
        by = {"stopped_by": "signal" if self._stop.requested else "stop file"} if status == "stopped" else {}
        self.run.set_status(status, step=self.step, total_steps=self.total_steps, **by)
        return status

    def run_blocking(self) -> str:
        self._stop.install()
        try:
            return asyncio.run(self.run_async())
        finally:
            self._stop.restore()
            self._executor.shutdown(wait=False)

    async def _cancel_rollouts(self, pending: "asyncio.Future | None") -> None:
        await cancel(pending)
        if self.stream is not None:
            await self.stream.close()

    async def _off_loop(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the learner's thread (one at a time with train_step), the loop free meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _watched(self, stage_work: Awaitable[T], step: int, stage: str, waiting_for: Callable[[], str]) -> T:
        """Await one stage, warning (log and dashboard) whenever nothing in it moved for `log.stall_warn_s`."""
        inflight = self.parts.runner.inflight
        return await watched(stage_work, f"step {step}: {stage}", self.cfg.log.stall_warn_s,
                             lambda: inflight.turns_done, waiting_for, self.dashboard.warn)

    def _rollout_waits(self) -> str:
        return self.parts.runner.inflight.describe(type(self.parts.backend).__name__)

    def _learner_waits(self) -> str:
        return (f"the learner's train_step ({type(self.parts.learner).__name__}, "
                f"deadline learner.call_timeout_s = {self.cfg.learner.call_timeout_s:g} s)")

    def _begin(self) -> None:
        drop_stale_stop(self.run.path)
        if self.step == 0 and not self.run.last_checkpoint():
            self.save_checkpoint("start")
        # The engine starts from the learner's adapter (a `model.checkpoint` to start from, or the fresh
        # LoRA, which also warms the engine's LoRA kernels before the first timed step).
        self._sync_adapter()
        self.run.set_status("running", step=self.step, total_steps=self.total_steps, preset=self.cfg.preset)

    # -- 1. rollouts ----------------------------------------------------------------------------------
    def _start_rollouts(self, step: int) -> "asyncio.Future[Rollouts | None]":
        if self.stream is not None:  # continuous: the first B groups that completed
            stage = self.dashboard.stage(ROLLOUTS, self.cfg.dataset.batch_size * self.cfg.dataset.group_size
                                         * self.cfg.turns, step)
            return asyncio.ensure_future(self.stream.take(stage))
        batch = self.sampler.next_batch()
        # Resume from the sampler state right after this step's batch was drawn (pipelined mode has
        # already drawn the next one when the checkpoint is written).
        self._sampler_after[step] = self.sampler.state_dict()
        if batch is None:
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        return asyncio.ensure_future(self._rollouts(step, batch))

    async def _rollouts(self, step: int, batch: list[Problem]) -> Rollouts:
        seed = step_seed(self.cfg.dataset.seed, step)
        seed_everything(seed)
        group = self.cfg.dataset.group_size
        # Tagged with its step: pipelined, it runs while the step before learns, and outlasts that step's end.
        with self.dashboard.stage(ROLLOUTS, len(batch) * group * self.cfg.turns, step):
            try:
                return await self.parts.runner.run_groups(batch, group, self.parts.learner.version, seed, self._on_turn)
            except BackendError as exc:  # off the loop: pipelined, the learner's step and its watch go on
                await asyncio.to_thread(self._restart_backend, exc, step)
                return await self.parts.runner.run_groups(batch, group, self.parts.learner.version, seed,
                                                          self._on_turn)

    def _restart_backend(self, exc: Exception, step: int) -> None:
        """A dead rollout worker is started again with the adapter it had and the step's rollouts are redone
        once; a second failure ends the run (never a step computed from half the rollouts)."""
        if getattr(exc, "final", False):
            raise exc  # every data-parallel replica failed twice, or a live one refused a request twice
        self.engine.restart(exc)  # given the adapter the dead one had: the learner may be mid-step
        log.warning("step %d: the step's rollouts are redone on the fresh rollout worker", step)

    def _on_turn(self, trajectory: Trajectory, turn: Turn) -> None:
        self.dashboard.advance(stage=ROLLOUTS)
        v = turn.verdict
        status = v.status.value if v is not None else "format_error"
        detail = f"x{v.speedup:.2f}" if v is not None and v.speedup else (",".join(v.flags) if v and v.flags else "")
        self.dashboard.kernel(trajectory.problem_key, turn.index + 1, status, detail)

    # -- 2. credit, 3. learn --------------------------------------------------------------------------
    def _credit(self, trajectories: list[Trajectory]) -> tuple[list[Any], dict[str, float]]:
        from kforge.credit.advantages import assign_returns, build_samples
        from kforge.credit.rewards import score_trajectories

        templates = score_trajectories(trajectories, self.cfg.reward, self.cfg.episode.thinking)  # the only scorer
        assign_returns(trajectories, self.cfg.episode.gamma)
        samples, stats = build_samples(trajectories, self.cfg.learner, self.cfg.reward,
                                       seed=step_seed(self.cfg.dataset.seed, self.step + 1, "shuffle"))
        return samples, {**stats, **templates}

    async def _learn(self, samples: list[Any], times: StepTimes) -> dict[str, float]:
        # Over when the optimiser step is: the sync, held-out eval and checkpoint after it have their own.
        with self.dashboard.stage("learn"):
            async with self.stream.learning_step() if self.stream else contextlib.nullcontext():
                return await self._learn_step(samples, times)

    async def _learn_step(self, samples: list[Any], times: StepTimes) -> dict[str, float]:
        if not samples:
            log.warning("step %d: no sample with a non-zero advantage; optimiser step skipped", self.step + 1)
            return {"learner/skipped": 1.0}
        # Colocated: no replica restarts on a learner rank's GPU during its step, and every engine replica
        # sleeps (weights to host RAM, KV cache freed), so the rank has the memory for its activations; they
        # wake for the next rollouts (one that died meanwhile starts again then).
        colocated = self.plan.mode == "colocated" and self.parts.backend is not None
        sleeps = colocated and self.cfg.rollout.sleep_between_phases
        t0 = time.time()
        if colocated:
            await asyncio.to_thread(self.engine.before_learning, sleeps)
            times.sleep_s, t0 = time.time() - t0, time.time()
        version = self.parts.learner.version
        self._learning = True  # stays set when train_step raises: the learner's state is then unknown
        try:
            with self.parts.activity.busy("learner", self.plan.learner):  # timed runs there see it
                metrics = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self.parts.learner.train_step, samples)
        finally:
            times.learn_s = time.time() - t0
        self._learning = False
        if colocated:
            await asyncio.to_thread(self.engine.after_learning, sleeps)
            times.wake_s = time.time() - t0 - times.learn_s
        staleness = [version - s.policy_version for s in samples]  # versions behind the weights it trained
        out = {k if "/" in k else f"learner/{k}": v for k, v in metrics.items()}
        out.update({"staleness/max": float(max(staleness)), "staleness/mean": sum(staleness) / len(staleness)})
        return out

    # -- 4. sync --------------------------------------------------------------------------------------
    def _sync_adapter(self, adapter_dir: Path | None = None, times: StepTimes | None = None) -> float:
        """Hand the learner's current adapter to the rollout engine; returns the seconds it took (its parts
        into ``times``)."""
        t0 = time.time()
        version = self.parts.learner.version
        if self.parts.shares_model:
            self.parts.backend.load_adapter("", version)  # live weights: only the version label changes
            return 0.0
        if adapter_dir is None and version == self._synced_version:
            return 0.0  # the learner skipped its step: the engine already has these weights
        self._synced_version = version
        def write() -> str:
            if adapter_dir is not None and (adapter_dir / "adapter_config.json").exists():
                return str(adapter_dir)
            return str(self._copies.write(version, lambda d, dtype: self.parts.learner.save_adapter(str(d), dtype)))

        saved = self.engine.hand_over(write, version)  # waits for a restart under way
        if times is not None:
            times.sync_save_s, times.sync_load_s = saved, time.time() - t0 - saved
        self._copies.prune(keep=3)
        return time.time() - t0

    # -- 5. log ---------------------------------------------------------------------------------------
    async def _held_out(self, step: int) -> dict[str, float]:
        every = self.cfg.log.eval_every
        if not (every and step % every == 0 and self.test_problems):
            return {}
        seed = step_seed(self.cfg.dataset.seed, step, "held-out")

        def on_turn(_trajectory: Trajectory, _turn: Turn) -> None:
            self.dashboard.advance(stage="held-out eval")

        with self.dashboard.stage("held-out eval", len(self.test_problems) * self.cfg.turns, step):
            rollouts = await self.parts.runner.run_groups(self.test_problems, 1, self.parts.learner.version, seed,
                                                          on_turn)
        return held_out_metrics(rollouts.trajectories, self.levels)

    async def _log(self, step: int, metrics: dict[str, Any], trajectories: list[Trajectory], sinks: MetricSinks) -> None:
        for warning in collapse_warnings(self._history, metrics):
            log.warning("step %d: %s", step, warning)
            self.dashboard.warn(warning)
        metrics.update({f"time/{k}": v for k, v in self.parts.backend.load_times.items()})
        self.run.log_metrics(metrics)
        turns = [t for tr in trajectories for t in tr.turns]
        sinks.write(step, metrics, {"hist/reward": [t.score for t in turns],
                                    "hist/response_tokens": [float(len(t.response_ids)) for t in turns]})
        if self.cfg.log.samples_max_mb > 0:
            await asyncio.to_thread(write_transcript, self.run.samples_path(step), step, trajectories,
                                    int(self.cfg.log.samples_max_mb * 2**20))
        self._history = (self._history + [metrics])[-10:]
        self.run.set_status("running", step=step, total_steps=self.total_steps, preset=self.cfg.preset)
        self.dashboard.end_step(step, metrics, metrics["time/step_s"])
        log.info("step %d/%d reward %.3f correct %.2f (%.1fs)", step, self.total_steps,
                 metrics.get("reward/mean", 0.0), metrics.get("rate/correct", 0.0), metrics["time/step_s"])

    # -- 6. checkpoints -------------------------------------------------------------------------------
    def _scheduled_checkpoint(self, step: int) -> dict[str, float]:
        every = self.cfg.log.save_every
        if not (every and step % every == 0 and step < self.total_steps):
            return {}
        t0 = time.time()
        self.save_checkpoint("scheduled")
        return {"time/checkpoint_s": time.time() - t0}

    def save_checkpoint(self, reason: str) -> Path:
        state, self._saving = {"sampler": self._sampler_after.get(self.step, self.sampler.state_dict())}, True
        if self.stream is not None:
            state["stream"] = self.stream.state_dict()
        path = self.run.write_checkpoint(self.step, lambda d: self.parts.learner.save_checkpoint(str(d)), state, reason)
        self._saving = False
        log.info("checkpoint %s (%s)", path.relative_to(self.run.path), reason)
        return path

    def restore(self, ckpt_dir: Path) -> None:
        state = read_trainer_state(ckpt_dir)
        self.parts.learner.load_checkpoint(str(ckpt_dir / LEARNER_DIR))
        self.sampler.load_state_dict(state["sampler"])
        if self.stream is not None:
            self.stream.load_state_dict(state.get("stream"), state["sampler"])
        self.step = int(state["step"])
        self._sync_adapter(ckpt_dir / LEARNER_DIR / "adapter")
        log.info("resumed from %s at step %d", ckpt_dir.name, self.step)

    def _failure(self, exc: BaseException) -> str:
        """The one line the run's status records for its failure, which the lifecycle says. A checkpoint whose
        save failed (a full disk, a read-only folder) is not written again: the line names its step and the
        newest checkpoint on disk, where --resume continues. After any other failure one is saved if it can be."""
        why = run_write_failure(exc, self.run.path)
        said = why or f"{type(exc).__name__}: {exc}"[:500]
        if not self._saving:
            self._save_what_we_can()
            return said
        newest = (self.run.last_checkpoint() or {}).get("path", "the start")
        then = f" (it continues from {newest})" if why else f"; kforge train --resume {self.run.path} continues from {newest}"
        return f"saving the checkpoint of step {self.step} failed: {said}{then}"

    def _save_what_we_can(self) -> None:
        """After a failure that was not a checkpoint's save: a checkpoint when the learner is alive and not
        mid-step (its state is then exactly that of `self.step`); else the last one is where --resume starts."""
        if self._learning or not getattr(self.parts.learner, "alive", lambda: True)():
            log.error("the learner's state is lost since %s; --resume continues from there",
                      (self.run.last_checkpoint() or {}).get("path", "the start"))
            return
        try:
            self.save_checkpoint("failed")
        except Exception as exc:  # best effort: the failure itself is what the user must see
            log.warning("could not save a checkpoint after the failure: %s", exc)

