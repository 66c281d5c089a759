"""What runs inside a sandboxed child: build a model, then answer the parent's requests one by one.

Jobs: `reference` (the problem's Model: trusted, no candidate code), `candidate` (ModelNew) and
`build` (import a CUDA candidate once so its load_inline extension lands in the build cache).

The child decides nothing. The parent sends one request at a time (see protocol.py) and accepts
only the one answer it expects: a trial's outputs for a seed it chose, the times and output
samples of a timed batch on inputs it chose, a profile. Everything this process reports about
itself (launches, timings, patched functions, refused audit events) is evidence the parent may use
to add flags, never to remove one: the candidate's code runs here and can rewrite any of it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
import traceback
import types
from typing import Any, Callable

import torch

from kforge.evaluator import guard as guard_mod
from kforge.evaluator import protocol as P
from kforge.evaluator.wire import read_pickle_blocking, send_message

# Bound before any candidate code runs: the harness times and syncs through these.
_perf = time.perf_counter
_no_grad = torch.no_grad


def _identity_table() -> dict[str, Any]:
    """Functions a timing or comparison hack would replace; compared before and after (evidence)."""
    table: dict[str, Any] = {}
    roots: dict[str, Any] = {"torch": torch, "time": time, "os": os}
    for path in ("torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
                 "torch.cuda.Event.synchronize", "torch.cuda.current_stream", "time.perf_counter", "time.time",
                 "time.monotonic", "time.perf_counter_ns", "torch.manual_seed", "torch.rand", "torch.randn",
                 "torch.rand_like", "torch.randn_like", "torch.Tensor.cpu", "torch.Tensor.to", "torch.Tensor.data_ptr",
                 "torch.Tensor.clone", "torch.Tensor.copy_", "torch.nn.Module.__call__", "os._exit", "os.write"):
        obj: Any = roots[path.split(".")[0]]
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
        table[path] = obj
    return table


def _changed(before: dict[str, Any], guard: guard_mod.Guard) -> list[str]:
    now = _identity_table()
    flags = [f"patched:{k}" for k, v in before.items() if now.get(k) is not v]
    flags += [f"patched:{k}" for k, (owner, attr, fn) in guard.patched.items() if getattr(owner, attr, None) is not fn]
    return flags


def _load_module(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _write(scratch: str, name: str, code: str) -> str:
    path = os.path.join(scratch, name)
    with open(path, "w") as fh:
        fh.write(code)
    return path


@contextlib.contextmanager
def _signed_rand() -> Any:
    """Inside get_inputs(): torch.rand -> torch.randn, so [0,1) inputs become signed."""
    saved = torch.rand, torch.rand_like
    torch.rand, torch.rand_like = torch.randn, torch.randn_like  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand, torch.rand_like = saved  # type: ignore[assignment]


def _device_context(device: str) -> Any:
    """`with torch.device(device)`, entered once with torch's own factories in place first.

    torch's device context decides which calls to redirect from a set of factory functions that it
    builds and caches on its first use in a process. Were that first use inside `_signed_rand`, the set
    would hold `torch.randn` where `torch.rand` belongs, and every later `torch.rand` in this process
    would build its tensor on the CPU with the CPU generator: other values than the reference's."""
    if device == "cpu":
        return contextlib.nullcontext()
    with torch.device(device):
        torch.empty(0)  # any call under the context builds (and caches) its set of factories
    return torch.device(device)


def make_inputs(problem: types.ModuleType, seed: int, signed: bool, device: str) -> list[Any]:
    """Seeded inputs built directly on `device` (building big inputs on the CPU dominated KernelBench)."""
    with _device_context(device), (_signed_rand() if signed else contextlib.nullcontext()):
        torch.manual_seed(seed)
        inputs = list(problem.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def _flatten(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _ranges(values: list[Any]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel():
            st = v.untyped_storage()
            out.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
    return out


def _category(exc: BaseException) -> str:
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"CompilationError", "CompileTimeAssertionFailure", "SyntaxError", "ImportError"}:
        return "compile_error"
    return "runtime_error"


def _error(wfd: int, stage: str, category: str, exc: BaseException | None = None, text: str = "") -> None:
    if exc is not None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:])
    send_message(wfd, {"type": P.ERROR, "stage": stage, "category": category, "message": text[-6000:]})


def _copy_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    with _no_grad():
        for key, value in model.state_dict().items():
            ref = state.get(key)
            if isinstance(ref, torch.Tensor) and ref.shape == value.shape and ref.dtype == value.dtype:
                value.copy_(ref.to(value.device))


def kernel_coverage(kernel_us: dict[str, float], own: set[str]) -> float | None:
    """Share of GPU kernel time spent in kernels whose name starts with one of the candidate's kernel names."""
    total = sum(kernel_us.values())
    if total <= 0:
        return None
    mine = sum(us for name, us in kernel_us.items() if any(name.startswith(o) for o in own))
    return mine / total


class _Session:
    """The request loop shared by the reference and the candidate (the candidate adds evidence)."""

    def __init__(self, model: Any, problem: types.ModuleType, device: str, wfd: int, rfd: int,
                 guard: guard_mod.Guard | None = None, identities: dict[str, Any] | None = None) -> None:
        self.model, self.problem, self.device = model, problem, device
        self.wfd, self.rfd = wfd, rfd
        self.guard, self.identities = guard, identities or {}
        self.on_gpu = device.startswith("cuda")
        self.sync: Callable[[], None] = torch.cuda.synchronize if self.on_gpu else (lambda: None)
        self.kept: list[list[Any]] = []
        self.flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device) if self.on_gpu else None

    def evidence(self) -> dict[str, Any]:
        if self.guard is None:
            return {}
        return {"denied": sorted(set(self.guard.denied)), "patched": _changed(self.identities, self.guard)}

    def call(self, inputs: list[Any]) -> list[Any]:
        with _no_grad():
            out = _flatten(self.model(*inputs))
        # Only plain tensors hold their values once the call returns: a subclass could compute lazily,
        # later, and only the elements the parent samples.
        for o in out:
            if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
                raise TypeError(f"outputs must be plain torch.Tensor objects, not {type(o).__name__}")
        self.sync()
        return out

    def trial(self, req: dict[str, Any]) -> dict[str, Any]:
        inputs = make_inputs(self.problem, int(req["seed"]), bool(req["signed"]), self.device)
        start = len(self.guard.launches) if self.guard else 0
        if self.guard is not None:
            self.guard.held = []
        out = self.call(inputs)
        # The outputs stay here until the parent asks for them (all, or values at positions it reveals now).
        self.kept = [out]
        meta = [[list(o.shape), str(o.dtype)] if isinstance(o, torch.Tensor) else None for o in out]
        msg: dict[str, Any] = {"type": P.TRIAL, "id": req["id"], "meta": meta}
        if self.guard is not None:
            in_ranges, out_ranges = _ranges(inputs), _ranges(out)
            ev = guard_mod.summarize(self.guard.launches[start:], in_ranges + out_ranges)
            ev["aliases_input"] = any(a < e and s < b for a, b in out_ranges for s, e in in_ranges)
            ev["equals_input"] = any(isinstance(o, torch.Tensor) and isinstance(x, torch.Tensor) and x.shape == o.shape
                                     and x.dtype == o.dtype and bool(torch.equal(x, o)) for o in out for x in inputs)
            msg["evidence"] = ev | self.evidence()
            self.guard.held = None
            del self.guard.launches[start:]  # evidence taken; timed calls must not grow the record
        else:  # the trusted reference says whether its inputs lie in [0, 1) (then a signed trial is added)
            floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()]
            msg["unit"] = bool(floats) and all(float(x.min()) >= 0.0 and float(x.max()) < 1.0 for x in floats)
        return msg

    def warmup(self, req: dict[str, Any]) -> dict[str, Any]:
        for seed in req["seeds"]:
            self.call(make_inputs(self.problem, int(seed), False, self.device))
        return {"type": P.WARM}

    def timed(self, req: dict[str, Any]) -> dict[str, Any]:
        """Fresh inputs per call; the window holds the call and a whole-device sync; outputs are kept
        for the parent's sample request."""
        ms: list[float] = []
        self.kept = []
        if self.guard is not None:
            del self.guard.launches[:]
        for seed in req["seeds"]:
            inputs = make_inputs(self.problem, int(seed), False, self.device)
            if self.flush is not None:
                self.flush.zero_()
            self.sync()
            if self.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = self.call(inputs)
                end.record()
                end.synchronize()
                ms.append(float(start.elapsed_time(end)))
            else:
                t0 = _perf()
                out = self.call(inputs)
                ms.append((_perf() - t0) * 1e3)
            self.kept.append(out)
            del inputs
        return {"type": P.TIMED, "ms": ms}

    def sample(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["positions"] == P.ALL:
            values: list[Any] = list(self.kept)
            self.kept = []
            return {"type": P.SAMPLES, "values": values}
        values = []
        for out in self.kept:
            row = []
            for i, pos in enumerate(req["positions"]):
                o = out[i] if i < len(out) else None
                if isinstance(o, torch.Tensor) and pos is not None:
                    row.append(o.reshape(-1)[pos.to(o.device)].cpu())
                else:
                    row.append(o if not isinstance(o, torch.Tensor) else None)
            values.append(row)
        self.kept = []
        return {"type": P.SAMPLES, "values": values}

    def profile(self, req: dict[str, Any]) -> dict[str, Any]:
        if not self.on_gpu or self.guard is None:
            return {"type": P.PROFILE, "coverage": None}
        from torch.profiler import ProfilerActivity, profile

        inputs = make_inputs(self.problem, int(req["seed"]), False, self.device)
        start = len(self.guard.launches)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self.call(inputs)
        own = {launch.name for launch in self.guard.launches[start:] if launch.candidate and launch.name}
        kernel_us: dict[str, float] = {}
        for ev in prof.key_averages():
            us = float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0) or 0.0)
            if us > 0 and ev.key:
                kernel_us[ev.key] = kernel_us.get(ev.key, 0.0) + us
        return {"type": P.PROFILE, "coverage": kernel_coverage(kernel_us, own)}

    def serve(self) -> None:
        handlers = {P.OP_TRIAL: self.trial, P.OP_WARMUP: self.warmup, P.OP_TIME: self.timed,
                    P.OP_SAMPLE: self.sample, P.OP_PROFILE: self.profile}
        while True:
            req = read_pickle_blocking(self.rfd)
            op = req.get("op")
            if op == P.OP_COMPILE:  # reference only: the torch.compile baseline
                self.model = torch.compile(self.model)
                continue
            if op not in handlers:  # OP_BYE
                return
            try:
                msg = handlers[op](req)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                _error(self.wfd, op, _category(exc), exc)
                return
            send_message(self.wfd, msg)


# ---------------------------------------------------------------------------------------------
# jobs
# ---------------------------------------------------------------------------------------------


def _gpu_init(device: str) -> float:
    t0 = _perf()
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.empty(1, device=device)
    return _perf() - t0


def run_reference(job: dict[str, Any], wfd: int, rfd: int) -> None:
    device = job["device"]
    try:
        cuda_init_s = _gpu_init(device)
        problem = _load_module("kforge_reference_problem", _write(job["scratch"], "problem.py", job["problem_code"]))
        torch.manual_seed(job["init_seed"])
        model = problem.Model(*list(problem.get_init_inputs()))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()} if isinstance(model, torch.nn.Module) else {}
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        if job.get("warm_triton") and device.startswith("cuda"):
            # Triton reads a kernel's source from its file; kforge's own folder is not readable here.
            _load_module("kforge_warm", _write(job["scratch"], "warm.py", _WARM_SOURCE)).warm(device)
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "reference", "runtime_error", exc)
        return
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    send_message(wfd, {"type": P.READY, "state": state, "gpu": gpu, "durations": {"cuda_init_s": cuda_init_s}})
    _Session(model, problem, device, wfd, rfd).serve()


# Compiles Triton's driver helpers into the warm cache that candidates get a copy of.
_WARM_SOURCE = """import torch
import triton
import triton.language as tl


@triton.jit
def fill(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, 1.0, mask=offs < n)


def warm(device):
    x = torch.empty(16, device=device)
    fill[(1,)](x, 16, BLOCK=16)
    torch.cuda.synchronize()
"""


def _install_load_inline(build_dir: str, guard: guard_mod.Guard | None) -> None:
    """Force every load_inline into the candidate's build folder (cached by source hash)."""
    from torch.utils import cpp_extension

    orig = cpp_extension.load_inline

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["build_directory"] = build_dir
        kwargs.setdefault("verbose", False)
        mod = orig(name, *args, **kwargs)
        if guard is not None and isinstance(mod, types.ModuleType):
            return guard_mod.recording_module(mod, guard)
        return mod

    cpp_extension.load_inline = load_inline


def run_build(job: dict[str, Any], wfd: int, rfd: int) -> None:
    """Import a CUDA candidate once so load_inline compiles into the cached build folder."""
    t0 = _perf()
    _install_load_inline(job["build_dir"], None)
    try:
        _load_module("kforge_candidate", _write(job["scratch"], "candidate.py", job["code"]))
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "build", "compile_error", exc)
        return
    send_message(wfd, {"type": P.BUILT, "compile_s": _perf() - t0})


def run_candidate(job: dict[str, Any], wfd: int, rfd: int) -> None:
    device = job["device"]
    path = os.path.join(job["scratch"], "candidate.py")
    guard = guard_mod.Guard(os.path.realpath(path))
    identities = _identity_table()
    guard_mod.install_launch_recorder(guard, interpreter=os.environ.get("TRITON_INTERPRET") == "1")
    if job["backend"] == "cuda":
        _install_load_inline(job["build_dir"], guard)
    durations: dict[str, float] = {}
    # Only get_inputs/get_init_inputs travel here (protocol.inputs_only): the reference Model never does.
    problem = _load_module("kforge_inputs", _write(job["scratch"], "inputs.py", job["inputs_code"]))
    durations["cuda_init_s"] = _gpu_init(device)
    _write(job["scratch"], "candidate.py", job["code"])
    if job.get("audit_hook", True):
        guard_mod.install_audit_hook(guard)
    t0 = _perf()
    try:
        cand = _load_module("kforge_candidate", path)
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "import", _category(exc), exc)
        return
    durations["import_s"] = _perf() - t0
    model_cls = getattr(cand, "ModelNew", None)
    if model_cls is None:
        _error(wfd, "import", "format_error", text="the module defines no ModelNew")
        return
    t0 = _perf()
    try:
        torch.manual_seed(job["init_seed"])
        model = model_cls(*list(problem.get_init_inputs()))
        if isinstance(model, torch.nn.Module):
            _copy_weights(model, job["state"])
            model = model.to(device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "init", _category(exc), exc)
        return
    durations["init_s"] = _perf() - t0
    session = _Session(model, problem, device, wfd, rfd, guard, identities)
    send_message(wfd, {"type": P.READY, "durations": durations, "evidence": session.evidence()})
    session.serve()


JOBS = {"reference": run_reference, "candidate": run_candidate, "build": run_build}
