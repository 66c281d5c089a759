"""The training loop: rollouts -> evaluator -> rewards -> learner -> new adapter, step after step.

One step: B problems x G trajectories x up to T turns are generated and evaluated (evaluations overlap
generation inside `run_episodes`), turn scores become returns and group advantages, the learner takes its
optimiser step(s) and the new adapter goes to the rollout engine. With `rollout.max_staleness >= 1` (and the
learner in its own process) the next step's rollouts start while the learner trains; the learner's
importance-sampling correction uses the rollout log-probs.

Determinism: every step re-seeds Python and torch from (seed, step), so a resumed run redoes the steps after
its last checkpoint with the same problems, the same samples and the same updates.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kforge.config.schema import KforgeConfig
from kforge.evaluator.verdict import Verdict
from kforge.policy.records import Trajectory, Turn
from kforge.rollout.base import BackendError
from kforge.problems.record import Problem
from kforge.runs.folder import STOP_FILE, RunFolder, atomic_write_text
from kforge.train.data import ProblemSampler
from kforge.train.metrics import MetricSinks, collapse_warnings, rollout_metrics
from kforge.train.placement import Plan

log = logging.getLogger("kforge.train")

TRAINER_STATE = "trainer_state.json"
CKPT_DIR = "checkpoints"


def step_seed(seed: int, step: int, salt: str = "") -> int:
    digest = hashlib.sha256(f"{seed}/{step}/{salt}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def code_hash(code: str) -> str:
    return hashlib.sha256(code.strip().encode()).hexdigest()


@dataclass
class StopFlag:
    """Ctrl-C once: finish the step, checkpoint, exit. Twice: stop now."""

    requested: bool = False
    reason: str = ""
    _old: Any = None

    def install(self) -> None:
        def handler(signum: int, frame: Any) -> None:
            if self.requested:
                raise KeyboardInterrupt
            self.requested, self.reason = True, "interrupted"
            log.warning("stop requested: finishing this step, saving a checkpoint (Ctrl-C again to stop now)")

        try:
            self._old = signal.signal(signal.SIGINT, handler)
            signal.signal(signal.SIGTERM, handler)
        except ValueError:  # not in the main thread (tests): no handler
            self._old = None

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


@dataclass
class Components:
    """What the trainer drives; built by `build_components`, replaceable piece by piece."""

    learner: Any
    backend: Any
    pool: Any
    builder: Any
    shares_model: bool  # rollout backend uses the learner's in-process model (CPU mode)


@dataclass
class Trainer:
    cfg: KforgeConfig
    run: RunFolder
    plan: Plan
    train_problems: list[Problem]
    test_problems: list[Problem]
    components: Components
    dashboard: Any = None
    step: int = 0
    sampler: ProblemSampler = field(init=False)
    _verdict_cache: dict[tuple[str, str], asyncio.Future] = field(default_factory=dict)
    _history: list[dict[str, Any]] = field(default_factory=list)
    _stop: StopFlag = field(default_factory=StopFlag)
    _sampler_after: dict[int, dict[str, int]] = field(default_factory=dict)
    stage_times: dict[str, float] = field(default_factory=dict)  # generate_s / eval_s summed over a step
    restart_backend: Callable[[], Any] | None = None  # builds a fresh rollout backend (GPU placements)
    _synced_version: int | None = None
    restarts: int = 0

    def __post_init__(self) -> None:
        ds = self.cfg.dataset
        self.sampler = ProblemSampler(self.train_problems, ds.batch_size, ds.epochs, ds.shuffle, ds.seed)
        self._levels = {p.key: p.level for p in self.train_problems + self.test_problems}
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kforge-learn")

    @property
    def total_steps(self) -> int:
        planned = self.sampler.total_steps
        return min(planned, self.cfg.max_steps) if self.cfg.max_steps else planned

    # -- evaluation with the run-wide cache -----------------------------------------------------------
    async def evaluate(self, problem: Problem, code: str, backend: str) -> Verdict:
        """A kernel source already evaluated for a problem in this run is not evaluated again."""
        key = (problem.key, code_hash(code))
        fut = self._verdict_cache.get(key)
        if fut is None:
            fut = asyncio.ensure_future(self._timed_eval(problem, code, backend))
            self._verdict_cache[key] = fut
        else:
            self._cache_hits += 1
        return await fut

    async def _timed_eval(self, problem: Problem, code: str, backend: str) -> Verdict:
        t0 = time.time()
        try:
            return await self.components.pool.evaluate(problem, code, backend)
        finally:
            self.stage_times["eval_s"] = self.stage_times.get("eval_s", 0.0) + time.time() - t0

    def score(self, turn: Turn, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        from kforge.learner.rewards import score_turn

        return score_turn(turn, self.cfg.reward, self.cfg.episode.thinking)

    def _on_turn(self, trajectory: Trajectory, turn: Turn) -> None:
        if self.dashboard is None:
            return
        self.dashboard.advance()
        v = turn.verdict
        status = v.status.value if v is not None else "format_error"
        detail = f"x{v.speedup:.2f}" if v is not None and v.speedup else (",".join(v.flags) if v and v.flags else "")
        self.dashboard.kernel(trajectory.problem_key, turn.index + 1, status, detail)

    # -- one rollout phase ----------------------------------------------------------------------------
    async def rollouts(self, problems: list[Problem], group_size: int, policy_version: int) -> list[Trajectory]:
        from kforge.policy.episode import run_episodes

        jobs = [(p, g) for p in problems for g in range(group_size)]
        if self.dashboard is not None:
            self.dashboard.set_stage("rollout + eval", total=len(jobs) * self.cfg.turns)
        return await run_episodes(
            jobs, _TimedBackend(self.components.backend, self.stage_times), self.components.builder,
            self.evaluate, self.score, self.cfg, policy_version, on_turn=self._on_turn,
        )

    async def _rollouts_with_restart(self, batch: list[Problem], step: int, version: int) -> list[Trajectory]:
        try:
            return await self.rollouts(batch, self.cfg.dataset.group_size, version)
        except BackendError as exc:
            return await self._restart_and_retry(exc, batch, step)

    async def _restart_and_retry(self, exc: Exception, batch: list[Problem] | None, step: int) -> list[Trajectory]:
        """A dead rollout worker is started again with the current adapter and the step is retried once;
        a second failure ends the run (never a step computed from half the rollouts)."""
        if self.components.shares_model or self.restart_backend is None or batch is None:
            raise exc
        log.warning("step %d: rollout worker failed (%s); restarting it and retrying the step", step,
                    str(exc).splitlines()[0])
        try:
            self.components.backend.close()
        except Exception as close_exc:  # the worker is already gone; closing is best effort
            log.warning("closing the failed rollout worker: %s", close_exc)
        self.components.backend = self.restart_backend()
        self._synced_version = None  # the new engine has no adapter yet
        self._sync_adapter()
        self.restarts += 1
        seed_everything(step_seed(self.cfg.dataset.seed, step))
        self.stage_times.clear()
        return await self.rollouts(batch, self.cfg.dataset.group_size, self.components.learner.version)

    # -- checkpoints ----------------------------------------------------------------------------------
    def save_checkpoint(self, reason: str) -> Path:
        """Learner state + trainer state into a temp folder, renamed into place only when complete."""
        root = self.run.path / CKPT_DIR
        root.mkdir(exist_ok=True)
        final = root / f"step_{self.step:06d}"
        tmp = root / f".tmp_step_{self.step:06d}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        self.components.learner.save_checkpoint(str(tmp / "learner"))
        # In pipelined mode the sampler has already drawn the next step's batch; resume from the state
        # right after this step's batch was drawn.
        sampler_state = self._sampler_after.get(self.step, self.sampler.state_dict())
        state = {"step": self.step, "sampler": sampler_state, "reason": reason, "time": time.time()}
        atomic_write_text(tmp / TRAINER_STATE, json.dumps(state, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        rel = final.relative_to(self.run.path)
        self.run.log_checkpoint({"step": self.step, "path": str(rel), "adapter": str(rel / "learner"),
                                 "reason": reason, "time": time.time()})
        log.info("checkpoint %s (%s)", rel, reason)
        return final

    def restore(self, ckpt_dir: Path) -> None:
        state = json.loads((ckpt_dir / TRAINER_STATE).read_text())
        self.components.learner.load_checkpoint(str(ckpt_dir / "learner"))
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self._sync_adapter(ckpt_dir / "learner" / "adapter")
        log.info("resumed from %s at step %d", ckpt_dir.name, self.step)

    def _sync_adapter(self, adapter_dir: Path | None = None) -> None:
        """Hand the learner's current adapter to the rollout engine (no-op when they share the model)."""
        if self.components.shares_model:
            return
        version = self.components.learner.version
        if adapter_dir is None and version == self._synced_version:
            return  # the learner skipped its step: the engine already has these weights
        self._synced_version = version
        if adapter_dir is None or not (adapter_dir / "adapter_config.json").exists():
            adapter_dir = self.run.path / "adapters" / f"v{version:06d}"
            self.components.learner.save_adapter(str(adapter_dir))
        self.components.backend.load_adapter(str(adapter_dir), version)
        # Keep only the last few exported adapter versions on disk.
        old = sorted((self.run.path / "adapters").glob("v*")) if (self.run.path / "adapters").exists() else []
        for path in old[:-3]:
            shutil.rmtree(path, ignore_errors=True)

    # -- held-out evaluation --------------------------------------------------------------------------
    async def held_out_eval(self) -> dict[str, float]:
        from kforge.eval.report import SampleOutcome, summarize

        if not self.test_problems:
            return {}
        trajs = await self.rollouts(self.test_problems, 1, self.components.learner.version)
        outcomes = [SampleOutcome(t.problem_key, self._levels.get(t.problem_key, 0), t.best_verdict,
                                  t.turns[0].verdict if t.turns else None) for t in trajs]
        summary = summarize(outcomes)["overall"]
        return {f"eval/{k}": float(v) for k, v in summary.items() if isinstance(v, (int, float)) and v is not None}

    # -- learning -------------------------------------------------------------------------------------
    def _learn(self, trajectories: list[Trajectory]) -> dict[str, float]:
        from kforge.learner.advantages import assign_returns, build_samples

        assign_returns(trajectories, self.cfg.episode.gamma)
        samples, adv_stats = build_samples(trajectories, self.cfg.learner)
        metrics = {f"advantage/{k}": float(v) for k, v in adv_stats.items()}
        version = self.components.learner.version
        if samples:
            staleness = [version - s.policy_version for s in samples]
            metrics["staleness/max"] = float(max(staleness))
            metrics["staleness/mean"] = sum(staleness) / len(staleness)
            learner_metrics = self.components.learner.train_step(samples)
            metrics.update({k if "/" in k else f"learner/{k}": v for k, v in learner_metrics.items()})
        else:
            metrics["learner/skipped"] = 1.0
            log.warning("step %d: no sample with a non-zero advantage; optimiser step skipped", self.step + 1)
        return metrics

    async def run_async(self) -> str:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        self._cache_hits = 0
        sinks = MetricSinks(str(self.run.path), cfg, resume_step=self.step)
        # One GPU: the engine sleeps while the learner trains, so only a split placement can overlap them.
        pipelined = cfg.rollout.max_staleness >= 1 and self.plan.mode == "split"
        # A STOP file left by an earlier `kforge runs stop` has been served; it must not stop this start.
        (self.run.path / STOP_FILE).unlink(missing_ok=True)
        if self.step == 0 and not self.run.last_checkpoint():
            self.save_checkpoint("start")
        # The engine starts from the learner's adapter (a `model.checkpoint` to start from, or the fresh
        # LoRA, which also warms the engine's LoRA kernels before the first timed step).
        self._sync_adapter()
        self.run.set_status("running", step=self.step, total_steps=self.total_steps, preset=cfg.preset)
        pending: asyncio.Task | None = None  # rollouts of the next step started early (pipelined mode)
        batch_of_pending: list[Problem] | None = None
        status = "finished"
        try:
            while self.step < self.total_steps:
                if self._stop.requested or self.run.stop_requested():
                    status = "stopped"
                    break
                t0 = time.time()
                step = self.step + 1
                if pending is None:
                    batch = self.sampler.next_batch()
                    if batch is None:
                        break
                    self._sampler_after[step] = self.sampler.state_dict()
                    seed_everything(step_seed(cfg.dataset.seed, step))
                    version = self.components.learner.version
                    self._cache_hits = 0
                    self.stage_times.clear()
                    trajectories = await self._rollouts_with_restart(batch, step, version)
                else:
                    try:
                        trajectories = await pending
                    except BackendError as exc:
                        trajectories = await self._restart_and_retry(exc, batch_of_pending, step)
                    pending = None
                t_roll = time.time() - t0

                if self.dashboard is not None:
                    self.dashboard.set_stage("learn", total=1)
                if self.components.backend is not None and self.plan.mode == "shared":
                    self.components.backend.sleep()
                t1 = time.time()
                learn = loop.run_in_executor(self._executor, self._learn, trajectories)
                if pipelined and step < self.total_steps:
                    # Next step's rollouts run on the current adapter while the learner trains (bounded
                    # staleness of one version; the learner corrects with the rollout log-probs).
                    next_batch = self.sampler.next_batch()
                    self._sampler_after[step + 1] = self.sampler.state_dict()
                    batch_of_pending = next_batch
                    if next_batch is not None:
                        seed_everything(step_seed(cfg.dataset.seed, step + 1))
                        pending = asyncio.ensure_future(
                            self.rollouts(next_batch, cfg.dataset.group_size, self.components.learner.version)
                        )
                learn_metrics = await learn
                t_learn = time.time() - t1
                if self.components.backend is not None and self.plan.mode == "shared":
                    self.components.backend.wake()
                t2 = time.time()
                self._sync_adapter()
                t_sync = time.time() - t2
                self.step = step

                metrics: dict[str, Any] = {"step": step, "time": time.time(), "epoch": self.sampler.epoch}
                metrics.update(rollout_metrics(trajectories, self._levels))
                metrics.update(learn_metrics)
                gen_tokens = sum(len(t.response_ids) for tr in trajectories for t in tr.turns)
                metrics.update({
                    "time/rollout_eval_s": t_roll, "time/learn_s": t_learn, "time/sync_s": t_sync,
                    "throughput/generate_tok_s": gen_tokens / t_roll if t_roll > 0 else 0.0,
                    "throughput/eval_kernels_min": 60.0 * sum(1 for tr in trajectories for t in tr.turns
                                                              if t.verdict is not None) / max(t_roll, 1e-9),
                    "eval/cache_hits": float(self._cache_hits),
                    "rollout/worker_restarts": float(self.restarts),
                    # generate_s: wall time inside the engine; eval_s: summed over candidates (they overlap).
                    "time/generate_s": self.stage_times.get("generate_s", 0.0),
                    "time/eval_sum_s": self.stage_times.get("eval_s", 0.0),
                })
                self.stage_times.clear()
                from kforge.train.gpu import role_gpu_stats

                metrics.update(role_gpu_stats(self.plan))
                if cfg.log.eval_every and step % cfg.log.eval_every == 0:
                    metrics.update(await self.held_out_eval())
                if cfg.log.save_every and step % cfg.log.save_every == 0 and step < self.total_steps:
                    t3 = time.time()
                    self.save_checkpoint("scheduled")
                    metrics["time/checkpoint_s"] = time.time() - t3
                metrics["time/step_s"] = time.time() - t0
                for warning in collapse_warnings(self._history, metrics):
                    log.warning("step %d: %s", step, warning)
                    if self.dashboard is not None:
                        self.dashboard.warn(warning)
                self.run.log_metrics(metrics)
                histograms = {"hist/reward": [t.score for tr in trajectories for t in tr.turns],
                              "hist/response_tokens": [float(len(t.response_ids)) for tr in trajectories for t in tr.turns]}
                sinks.write(step, metrics, histograms)
                self._history.append(metrics)
                self.run.set_status("running", step=step, total_steps=self.total_steps, preset=cfg.preset)
                if self.dashboard is not None:
                    self.dashboard.end_step(step, metrics, metrics["time/step_s"])
                log.info("step %d/%d reward %.3f correct %.2f (%.1fs)", step, self.total_steps,
                         metrics.get("reward/mean", 0.0), metrics.get("rate/correct", 0.0), metrics["time/step_s"])
            if pending is not None:
                pending.cancel()
            self.save_checkpoint("stop" if status == "stopped" else "end")
        except BaseException as exc:
            status = "stopped" if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else "failed"
            self.run.set_status(status, step=self.step, error=f"{type(exc).__name__}: {exc}"[:500])
            raise
        finally:
            sinks.close()
        self.run.set_status(status, step=self.step, total_steps=self.total_steps)
        return status

    def run_blocking(self) -> str:
        self._stop.install()
        try:
            return asyncio.run(self.run_async())
        finally:
            self._stop.restore()
            self._executor.shutdown(wait=False)


class _TimedBackend:
    """The rollout backend with the time spent generating added to `times['generate_s']`."""

    def __init__(self, backend: Any, times: dict[str, float]):
        self._backend, self._times = backend, times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def agenerate(self, requests: Any, on_completion: Any = None) -> Any:
        t0 = time.time()
        try:
            return await self._backend.agenerate(requests, on_completion)
        finally:
            self._times["generate_s"] = self._times.get("generate_s", 0.0) + time.time() - t0


def build_components(cfg: KforgeConfig, plan: Plan, total_steps: int | None,
                     log_fn: Callable[[str], None] = log.info) -> Components:
    """Learner, rollout backend, eval pool and prompt builder for this placement."""
    from kforge.evaluator import EvalPool
    from kforge.policy.prompts import PromptBuilder
    from kforge.rollout.base import make_backend

    pool = EvalPool(cfg.evaluator, devices=plan.eval or None)
    retriever = None
    if cfg.dataset.prompt_option == "raicl":
        from kforge.rag import load_retriever

        if not cfg.dataset.rag_index_path:
            raise ValueError("dataset.prompt_option=raicl needs dataset.rag_index_path (build one with `kforge rag build`)")
        retriever = load_retriever(cfg.dataset.rag_index_path, backend=cfg.dataset.backend)
    if plan.mode == "cpu":
        from kforge.learner.learner import Learner
        from kforge.rollout.hf import HFBackend

        log_fn("loading the model (CPU)")
        learner = Learner(cfg, device="cpu", total_steps=total_steps, temperature=cfg.rollout.temperature)
        backend = HFBackend.from_model(learner.model, learner.tokenizer, batch_size=cfg.rollout.hf_batch_size)
        shares = True
    else:
        from kforge.train.learner_proc import LearnerProcess

        log_fn(f"starting the learner on GPU {plan.physical('learner')}")
        learner = LearnerProcess(cfg, plan.physical("learner"), total_steps=total_steps)
        log_fn(f"starting the rollout engine on GPU {plan.physical('rollout')}")
        backend = make_backend(cfg, plan.rollout)
        shares = False
    tokenizer = backend.tokenizer
    builder = PromptBuilder.from_config(cfg, tokenizer, retriever=retriever)
    return Components(learner=learner, backend=backend, pool=pool, builder=builder, shares_model=shares)


def close_components(c: Components) -> None:
    for part in (c.backend, c.pool, c.learner):
        close = getattr(part, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # closing must not hide the run's own outcome
                log.warning("closing %s: %s", type(part).__name__, exc)
