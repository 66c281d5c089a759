"""What runs inside a sandboxed child: build the model, run the trials, time, report.

Three jobs: `reference` (the problem's Model: reference outputs, initial weights, eager baseline),
`candidate` (ModelNew: outputs per trial, launch counts, timings) and `build` (import a CUDA
candidate once so its load_inline extension is compiled into the build cache).

The child never sees reference outputs: it sends its own outputs and the parent compares. The
checks made here (launch counting, aliasing, identity of timing functions) run in a process the
candidate controls, so they are extra evidence only; every pass/fail decision is the parent's.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import time
import traceback
import types
from typing import Any, Callable

import torch

from kforge.evaluator.wire import read_pickle_blocking, send_safe

# Saved before any candidate code runs: the harness times and syncs through these, never through
# attributes the candidate could have replaced.
_perf = time.perf_counter
_no_grad = torch.no_grad


class _Launches:
    count = 0


def _install_launch_counter() -> dict[str, Any]:
    """Count real Triton launches (JITFunction.run / InterpretedFunction.run without warmup)."""
    patched: dict[str, Any] = {}
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:
        pass
    if os.environ.get("TRITON_INTERPRET") == "1":
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
    for cls in classes:
        orig = cls.run

        def run(self, *args, __orig=orig, **kwargs):  # type: ignore[no-untyped-def]
            out = __orig(self, *args, **kwargs)
            if not kwargs.get("warmup", False):
                _Launches.count += 1
            return out

        cls.run = run
        patched[f"{cls.__module__}.{cls.__name__}.run"] = (cls, "run", run)
    return patched


def _counting_module(mod: types.ModuleType) -> types.ModuleType:
    """Wrap a load_inline extension so each call of its functions counts as a launch."""
    proxy = types.ModuleType(mod.__name__)
    for name in dir(mod):
        attr = getattr(mod, name)
        if callable(attr) and not name.startswith("_"):
            def call(*a, __f=attr, **k):  # type: ignore[no-untyped-def]
                _Launches.count += 1
                return __f(*a, **k)

            setattr(proxy, name, call)
        else:
            setattr(proxy, name, attr)
    return proxy


def _install_load_inline(build_dir: str) -> None:
    """Force every load_inline into the candidate's build folder (cached by source hash)."""
    from torch.utils import cpp_extension

    orig = cpp_extension.load_inline

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["build_directory"] = build_dir
        kwargs.setdefault("verbose", False)
        mod = orig(name, *args, **kwargs)
        return _counting_module(mod) if isinstance(mod, types.ModuleType) else mod

    cpp_extension.load_inline = load_inline


def _identity_table() -> dict[str, Any]:
    """Functions a timing or comparison hack would replace; compared before and after."""
    table: dict[str, Any] = {}

    def add(path: str) -> None:
        obj: Any = {"torch": torch, "time": time, "os": os}[path.split(".")[0]]
        for part in path.split(".")[1:]:
            obj = getattr(obj, part, None)
        table[path] = obj

    for path in ("torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
                 "torch.cuda.Event.synchronize", "torch.cuda.current_stream", "time.perf_counter", "time.time",
                 "time.monotonic", "time.perf_counter_ns", "torch.allclose", "torch.equal", "torch.manual_seed",
                 "torch.rand", "torch.randn", "torch.rand_like", "torch.randn_like", "torch.Tensor.cpu",
                 "torch.Tensor.to", "torch.Tensor.data_ptr", "torch.Tensor.clone", "torch.Tensor.copy_",
                 "torch.Tensor.__eq__", "torch.nn.Module.__call__", "torch.save", "os._exit", "os.write"):
        add(path)
    return table


def _changed(before: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    now = _identity_table()
    flags = [f"patched:{k}" for k, v in before.items() if now.get(k) is not v]
    for key, (owner, attr, fn) in extra.items():
        if getattr(owner, attr, None) is not fn:
            flags.append(f"patched:{key}")
    return flags


def _load_module(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _signed_rand() -> Any:
    """Inside get_inputs(): torch.rand -> torch.randn, so [0,1) inputs become signed."""
    saved = torch.rand, torch.rand_like
    torch.rand, torch.rand_like = torch.randn, torch.randn_like  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand, torch.rand_like = saved  # type: ignore[assignment]


def make_inputs(problem: types.ModuleType, seed: int, signed: bool, device: str) -> list[Any]:
    """Seeded inputs built directly on `device` (building big inputs on the CPU dominated KernelBench)."""
    ctx = torch.device(device) if device != "cpu" else contextlib.nullcontext()
    with ctx, (_signed_rand() if signed else contextlib.nullcontext()):
        torch.manual_seed(seed)
        inputs = list(problem.get_inputs())
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def _flatten(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _to_wire(values: list[Any]) -> list[Any]:
    return [v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def _unit_interval(inputs: list[Any]) -> bool:
    floats = [x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel()]
    return bool(floats) and all(float(x.min()) >= 0.0 and float(x.max()) < 1.0 for x in floats)


def _sync_fn(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


def _error(wfd: int, stage: str, category: str, exc: BaseException | None = None, text: str = "",
           flags: list[str] | None = None) -> None:
    if exc is not None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:])
    send_safe(wfd, {"type": "error", "stage": stage, "category": category, "message": text[-6000:],
                    "flags": sorted(set(flags or []))})


def _category(exc: BaseException) -> str:
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"CompilationError", "CompileTimeAssertionFailure", "SyntaxError", "ImportError"}:
        return "compile_error"
    return "runtime_error"


def time_forward(model: Any, inputs: list[Any], warmup: int, trials: int, device: str,
                 sync: Callable[[], None], event_cls: Any) -> list[float]:
    """Milliseconds per call: CUDA events, 256 MB L2 flush and a whole-device sync in the window."""
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device)
    times: list[float] = []
    with _no_grad():
        for _ in range(warmup):
            model(*inputs)
        sync()
        for _ in range(trials):
            flush.zero_()
            sync()
            start, end = event_cls(enable_timing=True), event_cls(enable_timing=True)
            start.record()
            model(*inputs)
            sync()  # side-stream work ends before the end event
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
    del flush
    return times


def _copy_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> int:
    copied = 0
    with _no_grad():
        for key, value in model.state_dict().items():
            ref = state.get(key)
            if isinstance(ref, torch.Tensor) and ref.shape == value.shape and ref.dtype == value.dtype:
                value.copy_(ref.to(value.device))
                copied += 1
    return copied


def _write(scratch: str, name: str, code: str) -> str:
    path = os.path.join(scratch, name)
    with open(path, "w") as fh:
        fh.write(code)
    return path


# ---------------------------------------------------------------------------------------------
# jobs
# ---------------------------------------------------------------------------------------------


def run_reference(job: dict[str, Any], wfd: int, rfd: int) -> None:
    device = job["device"]
    sync = _sync_fn(device)
    t0 = _perf()
    try:
        problem = _load_module("kforge_reference_problem", _write(job["scratch"], "problem.py", job["problem_code"]))
        torch.manual_seed(job["init_seed"])
        init = list(problem.get_init_inputs())
        model = problem.Model(*init)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model = model.to(device)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        _error(wfd, "reference", "runtime_error", exc)
        return
    outputs: dict[str, list[Any]] = {}
    unit = False
    try:
        with _no_grad():
            for seed, signed in job["trials"]:
                inputs = make_inputs(problem, seed, signed, device)
                if seed == job["trials"][0][0]:
                    unit = _unit_interval(inputs)
                if signed and not job["signed_always"] and not unit:
                    continue
                out = _flatten(model(*inputs))
                sync()
                outputs[f"{seed}:{int(signed)}"] = _to_wire(out)
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "reference", "runtime_error", exc)
        return
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    send_safe(wfd, {"type": "outputs", "outputs": outputs, "state": state, "unit_inputs": unit, "gpu": gpu,
                    "run_s": _perf() - t0})
    reply = read_pickle_blocking(rfd)
    if not reply.get("time"):
        return
    inputs = make_inputs(problem, job["trials"][0][0], False, device)
    timings: dict[str, list[float]] = {}
    timings["eager"] = time_forward(model, inputs, job["warmup"], job["timing_trials"], device, sync, torch.cuda.Event)
    if job.get("compile"):
        compiled = torch.compile(model)
        timings["compile"] = time_forward(compiled, inputs, max(job["warmup"], 3), job["timing_trials"], device, sync,
                                          torch.cuda.Event)
    send_safe(wfd, {"type": "timings", "timings": timings})


def run_build(job: dict[str, Any], wfd: int, rfd: int) -> None:
    """Import a CUDA candidate once so load_inline compiles into the cached build folder."""
    t0 = _perf()
    _install_load_inline(job["build_dir"])
    try:
        _load_module("kforge_candidate", _write(job["scratch"], "candidate.py", job["code"]))
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "build", "compile_error", exc)
        return
    send_safe(wfd, {"type": "built", "compile_s": _perf() - t0})


def run_candidate(job: dict[str, Any], wfd: int, rfd: int) -> None:
    device = job["device"]
    on_gpu = device.startswith("cuda")
    identities = _identity_table()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    event_cls = torch.cuda.Event
    counters = _install_launch_counter()
    if job["backend"] == "cuda":
        _install_load_inline(job["build_dir"])
    flags: list[str] = []
    durations: dict[str, float] = {}

    # The problem module is needed for get_inputs(); its Model is a tripwire for the candidate.
    problem = _load_module("kforge_problem", _write(job["scratch"], "problem.py", job["problem_code"]))
    ref_model = problem.Model

    def tripwire(*_a: Any, **_k: Any) -> None:
        flags.append("calls_reference_model")
        raise RuntimeError("the reference Model may not be used by ModelNew")

    ref_model.forward = tripwire
    ref_model.__init__ = tripwire

    if on_gpu:  # measured on its own: the per-child price of a fresh CUDA context
        t0 = _perf()
        torch.cuda.init()
        torch.empty(1, device=device)
        durations["cuda_init_s"] = _perf() - t0
    t0 = _perf()
    try:
        cand = _load_module("kforge_candidate", _write(job["scratch"], "candidate.py", job["code"]))
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "import", _category(exc) if not isinstance(exc, SyntaxError) else "compile_error", exc,
               flags=flags)
        return
    durations["import_s"] = _perf() - t0
    model_cls = getattr(cand, "ModelNew", None)
    if model_cls is None:
        _error(wfd, "import", "format_error", text="the module defines no ModelNew")
        return
    if isinstance(model_cls, type) and issubclass(model_cls, ref_model):
        flags.append("subclasses_reference_model")
    flags += _changed(identities, counters)

    t0 = _perf()
    try:
        torch.manual_seed(job["init_seed"])
        init = list(problem.get_init_inputs())
        model = model_cls(*init)
        if isinstance(model, torch.nn.Module):
            _copy_weights(model, job["state"])
            model = model.to(device)
        if on_gpu:
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "init", _category(exc), exc, flags=flags)
        return
    durations["init_s"] = _perf() - t0
    send_safe(wfd, {"type": "stage", "stage": "imported", "durations": durations})

    def trial(seed: int, signed: bool) -> dict[str, Any]:
        inputs = make_inputs(problem, seed, signed, device)
        in_ptrs = [(x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()) for x in inputs
                   if isinstance(x, torch.Tensor)]
        before = _Launches.count
        with _no_grad():
            out = _flatten(model(*inputs))
        sync()
        launches = _Launches.count - before
        for o in out:
            if isinstance(o, torch.Tensor) and o.numel():
                ptr = o.untyped_storage().data_ptr()
                if any(start <= ptr < start + size for start, size in in_ptrs):
                    flags.append("output_aliases_input")
        # Evidence only: an output equal to an input is fine for ReLU on [0,1) inputs; the parent
        # turns this into a flag when that trial's comparison failed.
        equals_input = any(isinstance(o, torch.Tensor) and isinstance(x, torch.Tensor) and x.shape == o.shape
                           and x.dtype == o.dtype and bool(torch.equal(x, o)) for o in out for x in inputs)
        return {"seed": seed, "signed": signed, "outputs": _to_wire(out), "launches": launches,
                "equals_input": equals_input}

    t0 = _perf()
    results = []
    try:
        for seed, signed in job["trials"]:
            results.append(trial(seed, signed))
            if len(results) == 1:  # the first call pays Triton's JIT compile (or cache load)
                durations["first_trial_s"] = _perf() - t0
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "run", _category(exc), exc, flags=flags)
        return
    durations["correctness_s"] = _perf() - t0
    flags += _changed(identities, counters)
    send_safe(wfd, {"type": "outputs", "trials": results, "flags": sorted(set(flags)), "durations": durations})

    reply = read_pickle_blocking(rfd)
    if reply.get("action") != "continue":
        return
    timings: list[float] = []
    t0 = _perf()
    try:
        first = job["trials"][0][0]
        inputs = make_inputs(problem, first, False, device)
        if reply.get("time") and on_gpu:
            timings = time_forward(model, inputs, job["warmup"], job["timing_trials"], device, sync, event_cls)
        else:  # no timing here: still call it a few times, as timing would, before the last check
            with _no_grad():
                for _ in range(3):
                    model(*inputs)
            sync()
        durations["timing_s"] = _perf() - t0
        final = trial(*job["final"])
    except BaseException as exc:  # noqa: BLE001
        _error(wfd, "final", _category(exc), exc, flags=flags)
        return
    flags += _changed(identities, counters)
    send_safe(wfd, {"type": "final", "final": final, "timings": timings, "flags": sorted(set(flags)),
                    "durations": durations})


JOBS = {"reference": run_reference, "candidate": run_candidate, "build": run_build}


def source_hash(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]
