"""EvalPool: evaluate candidate kernels in sandboxed children, one zygote per eval device.

    pool = EvalPool(cfg, devices=[0, 1])            # or devices=None: CPU, Triton interpreter
    verdict = pool.submit(problem, code).result()

Per candidate: static checks (parent) -> reference outputs (a separate child, cached per problem,
seed and device) -> candidate child (import, trials) -> comparison (parent) -> timing, exclusive per
GPU, only for correct and unflagged kernels -> final consistency trial -> Verdict.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import hashlib
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kforge.config.paths import cache_root
from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import sandbox
from kforge.evaluator.children import CgroupFactory, Child, Zygote
from kforge.evaluator.compare import compare_outputs, identical
from kforge.evaluator.feedback import clean_error, write_feedback
from kforge.evaluator.static_check import check_source
from kforge.evaluator.verdict import Status, Timings, Verdict
from kforge.problems.record import Problem

SEED_BASE = 42
SIGNED_SEED = SEED_BASE + 1000
FINAL_SEED = SEED_BASE + 2000
BACKENDS = ("triton", "cuda")


def _sha(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def timings_from(ms: list[float]) -> Timings | None:
    if not ms:
        return None
    return Timings(median_ms=statistics.median(ms), mean_ms=statistics.fmean(ms),
                   std_ms=statistics.pstdev(ms) if len(ms) > 1 else 0.0, min_ms=min(ms), max_ms=max(ms), trials=len(ms))


@dataclass
class _Slot:
    """One eval device: its zygote, its timing lock (one timed candidate at a time) and its name."""

    index: int | None  # CUDA index (after CUDA_VISIBLE_DEVICES) or None for CPU
    zygote: Zygote
    gpu_name: str = "cpu"
    timing_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def device(self) -> str:
        return "cpu" if self.index is None else "cuda"

    @property
    def tag(self) -> str:
        return f"{self.gpu_name}|torch{torch.__version__}"


@dataclass
class _Reference:
    outputs: dict[str, list[Any]]
    state: dict[str, Any]
    trials: list[tuple[int, bool]]
    baseline_ms: list[float] | None = None
    error: str = ""


def _visible_physical(index: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if index < len(items):
            return items[index]
    return str(index)


def _gpu_name(physical: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", physical],
                             capture_output=True, text=True, timeout=20)
        name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        name = ""
    return name or f"cuda{physical}"


class EvalPool:
    """Sandboxed, concurrent candidate evaluation. Thread-safe; use as a context manager."""

    def __init__(self, cfg: EvaluatorConfig, devices: list[int] | None = None,
                 cache_dir: str | Path | None = None) -> None:
        self.cfg = cfg
        self.cache_dir = Path(cache_dir) if cache_dir is not None else cache_root()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = Path(tempfile.mkdtemp(prefix="kforge-pool-"))
        self.secrets = sandbox.secret_values()
        self.caps = sandbox.capabilities()
        self.cgroups = CgroupFactory()
        self.cpu_mode = not devices
        self._closed = False
        self._slots: list[_Slot] = []
        if self.cpu_mode:
            env = sandbox.clean_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
            self._slots.append(_Slot(None, Zygote("cpu", env, self.work_dir / "zygote-cpu.log")))
            per_slot = cfg.cpu_workers
        else:
            for index in devices or []:
                physical = _visible_physical(index)
                env = sandbox.clean_env(CUDA_VISIBLE_DEVICES=physical)
                slot = _Slot(index, Zygote(f"cuda{index}", env, self.work_dir / f"zygote-cuda{index}.log"))
                slot.gpu_name = _gpu_name(physical)
                self._slots.append(slot)
            per_slot = cfg.workers_per_gpu
        self._tokens: queue.Queue[_Slot] = queue.Queue()
        for _ in range(per_slot):
            for slot in self._slots:
                self._tokens.put(slot)
        n_workers = per_slot * len(self._slots)
        self._executor = cf.ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="kforge-eval")
        self._builders = cf.ThreadPoolExecutor(max_workers=cfg.build_workers, thread_name_prefix="kforge-build")
        self._ref_cache: dict[tuple[str, str], _Reference] = {}
        self._ref_locks: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()
        self._baseline_file: dict[str, Any] | None = None
        if cfg.baseline_file:
            self._baseline_file = json.loads(Path(cfg.baseline_file).read_text())
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
        early = self._precheck(problem, code, backend)
        if early is not None:
            fut: cf.Future[Verdict] = cf.Future()
            fut.set_result(early)
            return fut
        if backend == "cuda":
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
                ef = self._executor.submit(self._guarded, problem, code, backend, measure, build_dir, compile_s)
                ef.add_done_callback(lambda f: result.set_exception(f.exception()) if f.exception()
                                     else result.set_result(f.result()))

            self._builders.submit(self._build, problem, code).add_done_callback(after_build)
            return result
        return self._executor.submit(self._guarded, problem, code, backend, measure, None, 0.0)

    async def evaluate(self, problem: Problem, code: str, backend: str = "triton",
                       measure: bool | None = None) -> Verdict:
        return await asyncio.wrap_future(self.submit(problem, code, backend, measure))

    def evaluate_many(self, items: list[tuple[Problem, str, str]], measure: bool | None = None) -> list[Verdict]:
        futures = [self.submit(p, c, b, measure) for p, c, b in items]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._builders.shutdown(wait=True, cancel_futures=True)
        for slot in self._slots:
            slot.zygote.close()
        self.cgroups.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "EvalPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def gpu_names(self) -> list[str]:
        return [s.gpu_name for s in self._slots]

    # ---------------------------------------------------------------------------------------
    # stages
    # ---------------------------------------------------------------------------------------

    def _precheck(self, problem: Problem, code: str, backend: str) -> Verdict | None:
        if backend not in BACKENDS:
            return self._finish(Verdict(Status.UNSUPPORTED, details={"reason": f"unknown backend {backend!r} "
                                                                     f"(use one of {', '.join(BACKENDS)})"}))
        if not code or not code.strip():
            return self._finish(Verdict(Status.FORMAT_ERROR, details={"reason": "empty kernel source"}))
        if backend == "cuda" and self.cpu_mode:
            return self._finish(Verdict(Status.UNSUPPORTED, timing_meaningful=False, details={
                "reason": "CUDA candidates are unsupported on this machine: no GPU (use the triton backend)"}))
        rep = check_source(code, problem.code, backend)
        if rep.errors:
            syntax = rep.errors[0].startswith("SyntaxError")
            v = Verdict(Status.COMPILE_ERROR if syntax else Status.STATIC_CHECK_FAILED, flags=list(rep.flags), timing_meaningful=not self.cpu_mode)
            v.error = "\n".join(rep.errors)
            v.details["reason"] = rep.errors[0]
            return self._finish(v)
        return None

    def _guarded(self, problem: Problem, code: str, backend: str, measure: bool, build_dir: str | None,
                 compile_s: float) -> Verdict:
        slot = self._tokens.get()
        try:
            return self._evaluate(slot, problem, code, backend, measure, build_dir, compile_s)
        finally:
            self._tokens.put(slot)

    def _request(self, slot: _Slot, writable: list[str] | None = None) -> dict[str, Any]:
        writable = list(writable or [])
        if slot.index is not None:
            triton_cache = self.cache_dir / "triton" / _sha(slot.gpu_name)
            triton_cache.mkdir(parents=True, exist_ok=True)
            writable.append(str(triton_cache))
            writable += [str(p) for p in Path("/dev").glob("nvidia*")]
            # CUDA init fails (cudaGetDeviceCount error 304) unless /proc and /sys are writable; measured
            # on an H100 host. The candidate has a private /proc (PID namespace) and no init-namespace
            # capabilities, so this opens little.
            writable += ["/proc", "/sys"]
        writable += [p for p in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/shm") if os.path.exists(p)]
        env = dict(slot.zygote.env)
        if slot.index is not None:
            env["TRITON_CACHE_DIR"] = str(self.cache_dir / "triton" / _sha(slot.gpu_name))
            env["CUDA_CACHE_PATH"] = "/nonexistent"
            env["CUDA_CACHE_DISABLE"] = "1"
        return {"env": env, "writable": writable, "readable": [str(self.cache_dir)],
                "memory_bytes": int(self.cfg.memory_limit_gb * (1 << 30)),
                "restrict_reads": self.cfg.sandbox_restrict_reads}

    def _reference(self, slot: _Slot, problem: Problem, measure: bool) -> _Reference:
        """Reference outputs (and eager baseline on a GPU), computed once per problem and device."""
        n = self.cfg.num_correct_trials
        trials = [(SEED_BASE + i, False) for i in range(n)] + [(SIGNED_SEED, True), (FINAL_SEED, False)]
        key = (_sha(problem.code, repr(trials)), slot.tag)
        with self._lock:
            lock = self._ref_locks.setdefault(key, threading.Lock())
        with lock:
            ref = self._ref_cache.get(key)
            want_baseline = measure and slot.index is not None and self._file_baseline(problem) is None
            if ref is not None and (ref.baseline_ms is not None or not want_baseline or ref.error):
                return ref
            disk = self.cache_dir / "reference" / f"{key[0]}-{_sha(key[1])}.pt"
            if ref is None and disk.exists():
                try:
                    data = torch.load(disk, weights_only=True)
                    ref = _Reference(data["outputs"], data["state"], [tuple(t) for t in data["trials"]])
                except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed
                    ref = None
            baseline_path = self.cache_dir / "baselines" / f"{key[0]}-{_sha(key[1], self.cfg.baseline)}.json"
            if ref is not None and want_baseline and baseline_path.exists():
                ref.baseline_ms = json.loads(baseline_path.read_text())["ms"]
            if ref is None or (want_baseline and ref.baseline_ms is None):
                ref = self._run_reference(slot, problem, trials, want_baseline)
                if not ref.error:
                    disk.parent.mkdir(parents=True, exist_ok=True)
                    torch.save({"outputs": ref.outputs, "state": ref.state, "trials": ref.trials}, disk)
                    if ref.baseline_ms:
                        baseline_path.parent.mkdir(parents=True, exist_ok=True)
                        baseline_path.write_text(json.dumps({"problem": problem.name, "device": slot.tag,
                                                             "mode": self.cfg.baseline, "ms": ref.baseline_ms}))
            self._ref_cache[key] = ref
            return ref

    def _run_reference(self, slot: _Slot, problem: Problem, trials: list[tuple[int, bool]],
                       want_baseline: bool) -> _Reference:
        job = {"problem_code": problem.code, "init_seed": SEED_BASE, "trials": trials, "signed_always": False,
               "device": slot.device, "warmup": self.cfg.warmup_trials, "timing_trials": self.cfg.timing_trials,
               "compile": self.cfg.baseline == "compile"}
        child = Child(slot.zygote, self.cgroups, "reference", self._request(slot), job, str(self.work_dir))
        locked = False
        try:
            deadline = time.monotonic() + self.cfg.compile_timeout_s + self.cfg.run_timeout_s
            ref: _Reference | None = None
            while True:
                msg = child.recv(deadline)
                if msg["type"] == "error":
                    return _Reference({}, {}, [], error=clean_error(str(msg.get("message", "")), child.scratch, self.secrets))
                if msg["type"] == "exit":
                    return _Reference({}, {}, [], error=f"reference child ended early ({msg})\n"
                                      + clean_error(child.stderr_tail(), child.scratch, self.secrets))
                if msg["type"] == "outputs":
                    outputs = msg["outputs"]
                    kept = [t for t in trials if f"{t[0]}:{int(t[1])}" in outputs]
                    # A signed trial whose reference is not finite (log of a negative...) says nothing.
                    kept = [t for t in kept if not t[1] or all(
                        not isinstance(o, torch.Tensor) or not o.is_floating_point() or bool(torch.isfinite(o).all())
                        for o in outputs[f"{t[0]}:1"])]
                    ref = _Reference(outputs, msg["state"], kept)
                    if not want_baseline:
                        child.send({"time": False})
                        return ref
                    slot.timing_lock.acquire()
                    locked = True
                    child.send({"time": True})
                    deadline = time.monotonic() + self.cfg.run_timeout_s
                if msg["type"] == "timings" and ref is not None:
                    ms = msg["timings"].get(self.cfg.baseline) or msg["timings"].get("eager")
                    ref.baseline_ms = [float(x) for x in ms]
                    return ref
        except TimeoutError:
            return _Reference({}, {}, [], error="the reference timed out")
        except EOFError:
            return _Reference({}, {}, [], error="the reference child died\n"
                              + clean_error(child.stderr_tail(), child.scratch, self.secrets))
        finally:
            if locked:
                slot.timing_lock.release()
            child.close()

    def _file_baseline(self, problem: Problem) -> Timings | None:
        if not self._baseline_file:
            return None
        entry = self._baseline_file.get(f"level{problem.level}", {}).get(f"{problem.name}.py")
        if not entry:
            return None
        mean = float(entry["mean"])
        return Timings(median_ms=mean, mean_ms=mean, std_ms=float(entry.get("std", 0.0)),
                       min_ms=float(entry.get("min", mean)), max_ms=float(entry.get("max", mean)),
                       trials=int(entry.get("num_trials", 0)))

    def _build(self, problem: Problem, code: str) -> tuple[str, Verdict | None, float]:
        """Compile a CUDA candidate's load_inline extension in a sandboxed child (CPU work), cached."""
        build_dir = self.cache_dir / "cuda" / _sha(code, torch.__version__, self._slots[0].gpu_name)
        build_dir.mkdir(parents=True, exist_ok=True)
        if (build_dir / ".built").exists():
            return str(build_dir), None, 0.0
        slot = self._slots[0]
        t0 = time.monotonic()
        child = Child(slot.zygote, self.cgroups, "build", self._request(slot, [str(build_dir)]),
                      {"code": code, "build_dir": str(build_dir)}, str(self.work_dir))
        try:
            deadline = time.monotonic() + self.cfg.compile_timeout_s
            while True:
                msg = child.recv(deadline)
                if msg["type"] == "built":
                    (build_dir / ".built").write_text("ok")
                    return str(build_dir), None, time.monotonic() - t0
                if msg["type"] == "error":
                    v = Verdict(Status.COMPILE_ERROR, compile_s=time.monotonic() - t0,
                                error=clean_error(str(msg.get("message", "")), child.scratch, self.secrets, 12))
                    return str(build_dir), self._finish(v), v.compile_s
                if msg["type"] == "exit":
                    raise EOFError
        except TimeoutError:
            v = Verdict(Status.TIMEOUT, compile_s=time.monotonic() - t0,
                        details={"reason": f"compilation exceeded {self.cfg.compile_timeout_s:g} s"})
            return str(build_dir), self._finish(v), v.compile_s
        except EOFError:
            v = Verdict(Status.COMPILE_ERROR, compile_s=time.monotonic() - t0,
                        error=clean_error(child.stderr_tail(), child.scratch, self.secrets))
            return str(build_dir), self._finish(v), v.compile_s
        finally:
            child.close()

    def _finish(self, v: Verdict) -> Verdict:
        if self.cpu_mode:
            v.timing_meaningful = False
            v.speedup = None
        v.flags = sorted(set(v.flags))
        v.feedback = write_feedback(v)
        for s in self.secrets:
            v.feedback = v.feedback.replace(s, "***")
            v.error = v.error.replace(s, "***")
        return v

    def _evaluate(self, slot: _Slot, problem: Problem, code: str, backend: str, measure: bool,
                  build_dir: str | None, compile_s: float) -> Verdict:
        t_start = time.monotonic()
        rep = check_source(code, problem.code, backend)
        measure = measure and slot.index is not None
        ref = self._reference(slot, problem, measure)
        if ref.error:
            v = Verdict(Status.RUNTIME_ERROR, error="reference failed: " + ref.error,
                        details={"reason": "the problem's reference Model failed; not the candidate's fault",
                                 "reference_error": True})
            return self._finish(v)
        run_trials = [t for t in ref.trials if t[0] != FINAL_SEED]
        final_trial = (FINAL_SEED, False)
        job = {"code": code, "problem_code": problem.code, "backend": backend, "device": slot.device,
               "init_seed": SEED_BASE, "state": ref.state, "trials": run_trials, "final": final_trial,
               "warmup": self.cfg.warmup_trials, "timing_trials": self.cfg.timing_trials, "build_dir": build_dir}
        v = Verdict(Status.RUNTIME_ERROR, trials=len(run_trials), flags=list(rep.flags), compile_s=compile_s,
                    timing_meaningful=slot.index is not None)
        d = v.details
        d["durations"] = durations = {"build_s": compile_s}
        child = Child(slot.zygote, self.cgroups, "candidate", self._request(slot, [build_dir] if build_dir else []),
                      job, str(self.work_dir))
        durations["fork_s"] = child.fork_s
        locked = False
        stage = "import"
        done = False
        try:
            deadline = time.monotonic() + self.cfg.compile_timeout_s
            while not done:
                msg = child.recv(deadline)
                kind = msg["type"]
                if kind == "sandbox":
                    d["sandbox"] = {k: (list(x) if isinstance(x, tuple) else x) for k, x in msg["applied"].items()}
                elif kind == "stage":
                    stage = "run"
                    durations.update(msg.get("durations", {}))
                    v.compile_s = compile_s + durations.get("import_s", 0.0) + durations.get("init_s", 0.0)
                    deadline = time.monotonic() + self.cfg.run_timeout_s
                elif kind == "error":
                    category = str(msg.get("category"))
                    v.status = {"compile_error": Status.COMPILE_ERROR, "format_error": Status.FORMAT_ERROR}.get(
                        category, Status.RUNTIME_ERROR)
                    v.error = clean_error(str(msg.get("message", "")), child.scratch, self.secrets)
                    v.flags += [str(f) for f in msg.get("flags", [])]
                    if msg.get("stage") == "final":
                        v.status = Status.INCORRECT if v.trials_passed < v.trials else Status.CORRECT
                        v.flags.append("inconsistent_after_repeat")
                    done = True
                elif kind == "outputs":
                    durations.update(msg.get("durations", {}))
                    v.flags += [str(f) for f in msg.get("flags", [])]
                    self._judge(v, ref, msg["trials"], backend)
                    go = v.status is Status.CORRECT and not v.flags
                    if not go:
                        child.send({"action": "stop"})
                        done = True
                        continue
                    if measure:
                        slot.timing_lock.acquire()
                        locked = True
                    child.send({"action": "continue", "time": measure})
                    stage = "timing"
                    deadline = time.monotonic() + self.cfg.run_timeout_s
                elif kind == "final":
                    durations.update(msg.get("durations", {}))
                    v.flags += [str(f) for f in msg.get("flags", [])]
                    final = msg["final"]
                    want = ref.outputs.get(f"{final_trial[0]}:0")
                    if want is not None and not compare_outputs(final["outputs"], want, self.cfg).passed:
                        v.flags.append("inconsistent_after_repeat")
                    v.timings = timings_from([float(x) for x in msg.get("timings", [])])
                    done = True
                elif kind == "exit":
                    raise EOFError
        except TimeoutError:
            v.status = Status.TIMEOUT
            limit = self.cfg.compile_timeout_s if stage == "import" else self.cfg.run_timeout_s
            d["reason"] = f"{'Import/compile' if stage == 'import' else stage.capitalize()} exceeded {limit:g} s; the process was killed"
        except EOFError:
            exit_info = child.exit or child.wait_exit(2.0) or {}
            sig = exit_info.get("signal")
            v.status = Status.CRASHED
            if sig:
                d["reason"] = f"The process died from {signal.Signals(sig).name}"
                if sig == signal.SIGKILL:
                    d["reason"] += " (likely out of memory)"
            else:
                d["reason"] = f"The process exited with code {exit_info.get('code')} before reporting"
            v.error = clean_error(child.stderr_tail(), child.scratch, self.secrets)
        except Exception as exc:  # noqa: BLE001 - a malformed message is the child's fault
            v.status = Status.CRASHED
            d["reason"] = f"unreadable result from the child: {type(exc).__name__}"
        finally:
            if locked:
                slot.timing_lock.release()
            child.close()
        v.run_s = time.monotonic() - t_start
        if v.timings is not None:
            base = self._file_baseline(problem) if self.cfg.baseline_file else None
            if base is None and ref.baseline_ms:
                base = timings_from(ref.baseline_ms)
            v.baseline = base
            if base is not None and v.timings.median_ms > 0:
                v.speedup = base.median_ms / v.timings.median_ms
        if not v.timing_meaningful:
            v.speedup = None
        return self._finish(v)

    def _judge(self, v: Verdict, ref: _Reference, trials: list[dict[str, Any]], backend: str) -> None:
        """Compare every trial with the reference; set status, partial credit and hack flags."""
        passed = 0
        max_abs = max_rel = 0.0
        reasons: list[str] = []
        for t in trials:
            want = ref.outputs.get(f"{t['seed']}:{int(t['signed'])}")
            if want is None:
                continue
            res = compare_outputs(t["outputs"], want, self.cfg, scale_atol=bool(t["signed"]))
            passed += res.passed
            max_abs, max_rel = max(max_abs, res.max_abs), max(max_rel, res.max_rel)
            if not res.passed and t.get("equals_input"):
                v.flags.append("returns_input")
            if not res.passed:
                reasons.append(("signed-input trial: " if t["signed"] else f"trial {t['seed'] - SEED_BASE + 1}: ")
                               + res.reason)
            if int(t.get("launches", 0)) == 0:
                v.flags.append("no_kernel_launched")
        # The same outputs for different inputs: memoised or constant, whatever the tolerance said.
        for i in range(1, len(trials)):
            a, b = trials[i - 1], trials[i]
            ra = ref.outputs.get(f"{a['seed']}:{int(a['signed'])}")
            rb = ref.outputs.get(f"{b['seed']}:{int(b['signed'])}")
            if ra is not None and rb is not None and identical(a["outputs"], b["outputs"]) and not identical(ra, rb):
                v.flags.append("identical_outputs_across_trials")
                break
        v.trials = len(trials)
        v.trials_passed = passed
        v.max_abs_error, v.max_rel_error = max_abs, max_rel
        v.status = Status.CORRECT if passed == len(trials) and trials else Status.INCORRECT
        if reasons:
            v.details["reason"] = reasons[0]
            v.error = "\n".join(reasons[:3])
