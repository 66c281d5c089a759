"""EvalPool: evaluate candidate kernels in sandboxed children, one zygote per eval device.

    pool = EvalPool(cfg, devices=[0, 1])            # or devices=None: CPU, Triton interpreter
    verdict = pool.submit(problem, code).result()

Per candidate: static checks (here) -> CUDA build (a sandboxed child on a CPU worker, cached) ->
reference (reference.py, cached per problem and device) -> the candidate's examination
(examine.py: trials, comparison in this process, timed batches under the parent's clock) ->
Verdict. This file only schedules: which worker and device, which stage when. On a GPU the stages
themselves hold the device's gate (gate.py): timing alone, the rest of its GPU work shared.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path

from kforge import gpus
from kforge.config.paths import cache_root
from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import layers, sandbox
from kforge.evaluator import protocol as P
from kforge.evaluator.children import CgroupFactory, ProtocolViolation, Zygote
from kforge.evaluator.contention import GpuActivity
from kforge.evaluator.context import PoolContext, sha
from kforge.evaluator.examine import Examination
from kforge.evaluator.feedback import write_feedback
from kforge.evaluator.judge import file_timings, judge_speed, timings_from
from kforge.evaluator.own_text import candidate_error
from kforge.evaluator.reference import ReferenceCache
from kforge.evaluator.slot import Slot
from kforge.evaluator.static.static_check import check_source
from kforge.evaluator.verdict import Status, Timings, Verdict
from kforge.kernel_backends import KERNEL_BACKENDS, cpu_backends, names
from kforge.problems import baseline as baseline_file
from kforge.problems.record import Problem

DRAW_ATTEMPTS = 3  # draws of fresh inputs an evaluation may make when the reference fails on one


def _out_of_memory(error: str) -> bool:
    return "OutOfMemoryError" in error or "out of memory" in error.lower() or "DefaultCPUAllocator" in error


class EvalPool:
    """Sandboxed, concurrent candidate evaluation. Thread-safe; use as a context manager."""

    def __init__(self, cfg: EvaluatorConfig, devices: list[int] | None = None,
                 cache_dir: str | Path | None = None, activity: GpuActivity | None = None) -> None:
        """`activity`: a GpuActivity the trainer fills, so that a verdict says which roles shared its timed run."""
        self.cfg = cfg
        cache = Path(cache_dir) if cache_dir is not None else cache_root()
        cache.mkdir(parents=True, exist_ok=True)
        self.ctx = PoolContext(cfg, CgroupFactory(), Path(tempfile.mkdtemp(prefix="kforge-pool-")), cache,
                               sandbox.secret_values(), activity)
        self.cache_dir = cache
        self.caps = layers.capabilities()
        self.cpu_mode = not devices
        self._closed = False
        self._slots: list[Slot] = []
        work = self.ctx.work_dir
        if self.cpu_mode:
            env = sandbox.clean_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
            self._slots.append(Slot(None, Zygote("cpu", env, work / "zygote-cpu.log")))
            per_slot = cfg.cpu_workers
        else:
            for index in devices or []:
                env = sandbox.clean_env(CUDA_VISIBLE_DEVICES=gpus.physical_id(index))
                slot = Slot(index, Zygote(f"cuda{index}", env, work / f"zygote-cuda{index}.log"))
                slot.gpu_name = gpus.gpu_name(index)
                if cfg.startups_per_gpu:
                    slot.startups = threading.BoundedSemaphore(cfg.startups_per_gpu)
                self._slots.append(slot)
            per_slot = cfg.workers_per_gpu
        self._tokens: queue.Queue[Slot] = queue.Queue()
        for _ in range(per_slot):
            for slot in self._slots:
                self._tokens.put(slot)
        self._executor = cf.ThreadPoolExecutor(max_workers=per_slot * len(self._slots), thread_name_prefix="kforge-eval")
        self._builders = cf.ThreadPoolExecutor(max_workers=cfg.build_workers, thread_name_prefix="kforge-build")
        # Runs of the reference on an evaluation's new inputs, while the candidate's child starts and imports.
        self._drawers = cf.ThreadPoolExecutor(max_workers=per_slot * len(self._slots), thread_name_prefix="kforge-draw")
        self.references = ReferenceCache(self.ctx)
        self._baseline_file = baseline_file.read(Path(cfg.baseline_file)) if cfg.baseline_file else {}
        # Start the zygotes now (in parallel): their torch/triton import is the slow part.
        list(cf.ThreadPoolExecutor(max_workers=len(self._slots)).map(lambda s: s.zygote.ensure(), self._slots))

    # ---------------------------------------------------------------------------------------
    # public API
    # ---------------------------------------------------------------------------------------

    def submit(self, problem: Problem, code: str, backend: str = "triton",
               measure: bool | None = None) -> cf.Future[Verdict]:
        if self._closed:
            raise RuntimeError("EvalPool is closed")
        measure = self.cfg.measure_performance if measure is None else measure
        early, flags = self._precheck(problem, code, backend)
        if early is not None:
            fut: cf.Future[Verdict] = cf.Future()
            fut.set_result(early)
            return fut
        if not KERNEL_BACKENDS[backend].built:
            return self._executor.submit(self._guarded, problem, code, backend, measure, None, 0.0, flags)
        result: cf.Future[Verdict] = cf.Future()

        def after_build(bf: cf.Future[tuple[str, Verdict | None, float]]) -> None:
            try:
                build_dir, failed, compile_s = bf.result()
            except BaseException as exc:  # noqa: BLE001
                result.set_exception(exc)
                return
            if failed is not None:
                result.set_result(failed)
                return
            ef = self._executor.submit(self._guarded, problem, code, backend, measure, build_dir, compile_s, flags)
            ef.add_done_callback(lambda f: result.set_exception(f.exception()) if f.exception()
                                 else result.set_result(f.result()))

        self._builders.submit(self._build, problem, code, backend).add_done_callback(after_build)
        return result

    async def evaluate(self, problem: Problem, code: str, backend: str = "triton",
                       measure: bool | None = None) -> Verdict:
        return await asyncio.wrap_future(self.submit(problem, code, backend, measure))

    def evaluate_many(self, items: list[tuple[Problem, str, str]], measure: bool | None = None) -> list[Verdict]:
        futures = [self.submit(p, c, b, measure) for p, c, b in items]
        return [f.result() for f in futures]

    def time_reference(self, problem: Problem, modes: tuple[str, ...] = ("eager",)) -> dict[str, Timings]:
        """The reference's own time on this pool's first GPU, per mode (eager, compile); cached."""
        if self.cpu_mode:
            raise RuntimeError("timing a reference needs a GPU; this pool runs on the CPU")
        slot = self._tokens.get()
        try:
            ref = self.references.timed(slot, problem, tuple(modes))[0]  # the timing alone: no draw of inputs
        finally:
            self._tokens.put(slot)
        if ref.error:
            raise RuntimeError(f"the reference of {problem.key} failed: {ref.error}")
        return {m: t for m in modes if (t := timings_from(ref.baseline_ms.get(m, []))) is not None}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._builders.shutdown(wait=True, cancel_futures=True)
        self._drawers.shutdown(wait=True, cancel_futures=True)
        for slot in self._slots:
            slot.zygote.close()
        self.ctx.cgroups.close()
        shutil.rmtree(self.ctx.work_dir, ignore_errors=True)

    def __enter__(self) -> "EvalPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gpu_names(self) -> list[str]:
        return [s.gpu_name for s in self._slots]

    # ---------------------------------------------------------------------------------------
    # stages
    # ---------------------------------------------------------------------------------------

    def _precheck(self, problem: Problem, code: str, backend: str) -> tuple[Verdict | None, list[str]]:
        """A verdict when the candidate cannot run (or may not), else None and the static check's flags."""
        rule = KERNEL_BACKENDS.get(backend)
        if rule is None:
            return self._finish(Verdict(Status.UNSUPPORTED, details={"reason": f"unknown backend {backend!r} "
                                                                     f"(use one of {names()})"})), []
        if not code or not code.strip():
            return self._finish(Verdict(Status.FORMAT_ERROR, details={"reason": "empty kernel source"})), []
        if rule.needs_gpu and self.cpu_mode:
            return self._finish(Verdict(Status.UNSUPPORTED, timing_meaningful=False, details={
                "reason": f"{rule.label} candidates are unsupported on this machine: no GPU "
                          f"(use the {cpu_backends()} backend)"})), []
        if problem.hub_models:
            return self._finish(Verdict(Status.UNSUPPORTED, details={
                "reason": f"the reference downloads {', '.join(problem.hub_models)} from the hub; "
                          "not evaluated here"})), []
        rep = check_source(code, problem.code, backend)
        if rep.errors and self.cfg.static_checks:
            syntax = rep.errors[0].startswith("SyntaxError")
            v = Verdict(Status.COMPILE_ERROR if syntax else Status.STATIC_CHECK_FAILED, flags=list(rep.flags),
                        timing_meaningful=not self.cpu_mode)
            v.error = "\n".join(rep.errors)
            v.details["reason"] = rep.errors[0]
            return self._finish(v), []
        return None, list(rep.flags) if self.cfg.static_checks else []

    def _guarded(self, problem: Problem, code: str, backend: str, measure: bool, build_dir: str | None,
                 compile_s: float, flags: list[str]) -> Verdict:
        slot = self._tokens.get()
        try:
            return self._evaluate(slot, problem, code, backend, measure, build_dir, compile_s, flags)
        finally:
            self._tokens.put(slot)

    def _evaluate(self, slot: Slot, problem: Problem, code: str, backend: str, measure: bool,
                  build_dir: str | None, compile_s: float, flags: list[str]) -> Verdict:
        t_start = time.monotonic()
        baselines = (self.cfg.baseline,) if measure and self._file_baseline(problem) is None else ()
        ref, key, fresh = self.references.timed(slot, problem, baselines)
        if ref.error and _out_of_memory(ref.error):
            return self._finish(Verdict(Status.UNSUPPORTED, error=ref.error, details={
                "reason": "skipped: the problem does not fit on this device (its reference ran out of memory)",
                "reference_error": True}))
        if ref.error:
            v = Verdict(Status.RUNTIME_ERROR, error="reference failed: " + ref.error,
                        details={"reason": "the problem's reference Model failed; not the candidate's fault",
                                 "reference_error": True})
            return self._finish(v)
        for attempt in range(1, DRAW_ATTEMPTS + 1):
            v = Verdict(Status.RUNTIME_ERROR, flags=list(flags), compile_s=compile_s,
                        timing_meaningful=slot.on_gpu and measure)
            v.details["durations"] = {"build_s": compile_s}
            drawn = self._drawers.submit(self.references.draw, slot, problem, ref, key, fresh and attempt == 1)
            Examination(self.ctx, slot, ref, v, drawn).run(code, problem.code, backend, build_dir)
            # The reference ran on this device before (its clock is cached): a draw of it that failed now met
            # the machine (memory another pool held, a start-up that timed out under load), not the candidate.
            if not v.details.get("reference_error"):
                break
            v.details["draw_attempts"] = attempt
        v.run_s = time.monotonic() - t_start
        judge_speed(v, self._file_baseline(problem), ref.baseline_ms, self.cfg.baseline)
        return self._finish(v)

    def _file_baseline(self, problem: Problem) -> Timings | None:
        return file_timings(baseline_file.lookup(self._baseline_file, problem))

    def _build(self, problem: Problem, code: str, backend: str) -> tuple[str, Verdict | None, float]:
        """Compile a candidate's extension (CUDA: load_inline) in a sandboxed child (CPU work), cached.

        The build folder is the build child's to write, and read-only to every child judged after it
        (examine.py): nothing an evaluation writes there reaches a later one. It is keyed by the source and
        the problem, so one problem's evaluation leaves nothing for another's. Whether it finished is
        recorded outside it, in a folder no child can reach, so the parent never writes through a path a
        child controls."""
        import torch

        key = sha(code, problem.code, torch.__version__, self._slots[0].gpu_name)
        build_dir = self.cache_dir / backend / key
        done = self.cache_dir / f"{backend}-built" / key
        build_dir.mkdir(parents=True, exist_ok=True)
        if done.exists():
            return str(build_dir), None, 0.0
        slot = self._slots[0]
        t0 = time.monotonic()
        child = self.ctx.child(slot, "build", {"code": code, "build_dir": str(build_dir)}, [str(build_dir)])
        try:
            deadline = time.monotonic() + self.cfg.compile_timeout_s
            child.ask(None, "sandbox", deadline)
            msg = child.ask(None, P.BUILT, deadline)
            if msg["type"] == P.BUILT:
                done.parent.mkdir(parents=True, exist_ok=True)
                done.write_text("ok")
                return str(build_dir), None, time.monotonic() - t0
            v = Verdict(Status.COMPILE_ERROR, compile_s=time.monotonic() - t0,
                        error=candidate_error(str(msg.get("message", "")), code, problem.code))
            return str(build_dir), self._finish(v), v.compile_s
        except TimeoutError:  # a build that never finishes did not compile (TIMEOUT would earn the compile reward)
            v = Verdict(Status.COMPILE_ERROR, compile_s=time.monotonic() - t0,
                        details={"reason": f"compilation exceeded {self.cfg.compile_timeout_s:g} s"})
            return str(build_dir), self._finish(v), v.compile_s
        except (EOFError, ProtocolViolation):
            v = Verdict(Status.COMPILE_ERROR, compile_s=time.monotonic() - t0,
                        error=candidate_error(child.stderr_tail(), code, problem.code))
            return str(build_dir), self._finish(v), v.compile_s
        finally:
            child.close()

    def _finish(self, v: Verdict) -> Verdict:
        if self.cpu_mode:
            v.timing_meaningful = False
        v.flags = sorted(set(v.flags))
        v.feedback = write_feedback(v)
        for s in self.ctx.secrets:
            v.feedback = v.feedback.replace(s, "***")
            v.error = v.error.replace(s, "***")
        return v
