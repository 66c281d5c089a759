"""What runs inside a sandboxed child: build a model, then serve the parent's requests (loop.py).

Jobs: `reference` (the problem's Model: trusted, no candidate code), `candidate` (ModelNew) and
`build` (import a CUDA candidate once so its load_inline extension lands in the build cache).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from typing import Any

import torch

from kforge.evaluator import confine
from kforge.evaluator import protocol as P
from kforge.evaluator.child import guard as guard_mod
from kforge.evaluator.child.coverage import cuda_kernel_names
from kforge.evaluator.child.isolation import DispatchSeal, modes
from kforge.evaluator.child.loop import RequestLoop, category, send_error
from kforge.evaluator.wire import send_message

# Bound before any candidate code runs.
_perf = time.perf_counter
_no_grad = torch.no_grad


def _identity_table() -> dict[str, Any]:
    """Functions a timing or comparison hack would replace; compared before and after (evidence)."""
    table: dict[str, Any] = {}
    roots: dict[str, Any] = {"torch": torch, "time": time, "os": os}
    for path in P.WATCHED:
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
    """A source file the child imports, read-only once written: no library call the candidate makes
    (numpy.savetxt opens files for it) can put source there that the static check never saw."""
    path = os.path.join(scratch, name)
    with open(path, "w") as fh:
        fh.write(code)
    os.chmod(path, 0o444)
    return path


def _copy_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    with _no_grad():
        for key, value in model.state_dict().items():
            ref = state.get(key)
            if isinstance(ref, torch.Tensor) and ref.shape == value.shape and ref.dtype == value.dtype:
                value.copy_(ref.to(value.device))


# ---------------------------------------------------------------------------------------------
# jobs
# ---------------------------------------------------------------------------------------------


def _gpu_init(device: str) -> float:
    t0 = _perf()
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.empty(1, device=device)
    return _perf() - t0


def _start_pools() -> dict[int, int]:
    """Start torch's CPU thread pool now and return the threads running then ({id: start time}): every one
    of them was started before any candidate code ran (the harness's, torch's, CUDA's after `_gpu_init`).
    The pool starts at torch's first parallel op with enough work for every thread (32768 values each);
    started later, by a model build, its threads would be strays at the lock-down."""
    torch.ones(32768 * 2 * max(1, torch.get_num_threads())).add_(1.0)
    return confine.threads()


def _lock(spec: dict[str, Any], known: dict[int, int], wfd: int) -> dict[str, Any]:
    """confine.lock_down, or, when a thread started after the set-up is still running (Landlock would not
    hold for it), the error that tells the parent, and the end of this child."""
    try:
        return confine.lock_down(spec, known)
    except confine.StrayThreads as exc:
        send_error(wfd, "lockdown", "runtime_error", text=f"PermissionError: {LOCKDOWN_REFUSED} ({exc})")
        os._exit(0)


LOCKDOWN_REFUSED = "kforge sandbox: a thread started before the lock-down is not allowed in a candidate kernel"


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
        send_error(wfd, "reference", "runtime_error", exc)
        return
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    send_message(wfd, {"type": P.READY, "state": state, "gpu": gpu, "durations": {"cuda_init_s": cuda_init_s}})
    # Sealed as a candidate's loop is, so the check after each timed call's window costs both sides alike.
    RequestLoop(model, problem, device, wfd, rfd, job.get("arena_fd"), seal=DispatchSeal()).serve()


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
    """Send every load_inline to the candidate's build folder (keyed by its source and the problem).

    The build job (no guard) compiles there. A candidate being judged (guard) only loads what the build
    left: the folder is read-only to it, so nothing one evaluation writes there reaches a later one."""
    from torch.utils import cpp_extension

    orig = cpp_extension.load_inline
    seen: dict[str, list[str]] = {}  # per name, the sources loaded under it (torch renames a changed one)

    def built(name: str, args: tuple[object, ...], kwargs: dict[str, Any]) -> object:
        sources = repr((args, sorted((k, repr(v)) for k, v in kwargs.items())))
        versions = seen.setdefault(name, [])
        if sources not in versions:
            versions.append(sources)
        version = versions.index(sources)
        library = name if version == 0 else f"{name}_v{version}"
        return cpp_extension._import_module_from_library(library, build_dir, kwargs.get("is_python_module", True))

    def load_inline(name: str, *args: object, **kwargs: object) -> object:  # a module, or a library's path
        kwargs["build_directory"] = build_dir
        kwargs.setdefault("verbose", False)
        if guard is None:
            return orig(name, *args, **kwargs)
        # its own kernels, by name, for GPU-time coverage
        sources = kwargs.get("cuda_sources", args[1] if len(args) > 1 else "")
        kernels, spaces = cuda_kernel_names("\n".join(sources) if isinstance(sources, (list, tuple)) else str(sources))
        guard.cuda_kernels |= kernels
        guard.cuda_namespaces |= spaces
        mod = built(name, args, kwargs)
        if isinstance(mod, types.ModuleType):
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
        send_error(wfd, "build", "compile_error", exc)
        return
    send_message(wfd, {"type": P.BUILT, "compile_s": _perf() - t0})


def run_candidate(job: dict[str, Any], wfd: int, rfd: int) -> None:
    device = job["device"]
    path = os.path.join(job["scratch"], "candidate.py")
    guard = guard_mod.Guard(os.path.realpath(path))
    identities = _identity_table()
    guard_mod.install_launch_recorder(guard, interpreter=os.environ.get("TRITON_INTERPRET") == "1")
    if job["build_dir"] is not None:  # the parent's build step compiled it (CUDA): load_inline loads from there
        _install_load_inline(job["build_dir"], guard)
    durations: dict[str, float] = {}
    # Only get_inputs/get_init_inputs travel here (protocol.inputs_only): the reference Model never does.
    problem = _load_module("kforge_inputs", _write(job["scratch"], "inputs.py", job["inputs_code"]))
    durations["cuda_init_s"] = _gpu_init(device)
    known = _start_pools()  # taken before the candidate's file exists: nothing of it has run
    _write(job["scratch"], "candidate.py", job["code"])
    sys.dont_write_bytecode = True  # an import the candidate makes reads a library's files; it writes none
    seal, baseline = DispatchSeal(), modes()  # before any of the candidate's code runs
    if job.get("audit_hook", True):
        guard_mod.freeze_modules(guard)
        guard_mod.install_audit_hook(guard)
    t0 = _perf()
    try:
        cand = _load_module("kforge_candidate", path)
    except BaseException as exc:  # noqa: BLE001
        send_error(wfd, "import", category(exc), exc)
        return
    durations["import_s"] = _perf() - t0
    model_cls = getattr(cand, "ModelNew", None)
    if model_cls is None:
        send_error(wfd, "import", "compile_error", text="the module defines no ModelNew")
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
        send_error(wfd, "init", category(exc), exc)
        return
    durations["init_s"] = _perf() - t0
    loop = RequestLoop(model, problem, device, wfd, rfd, job.get("arena_fd"), guard,
                      lambda: _changed(identities, guard), seal, baseline)
    spec = job.get("lockdown")
    if spec is not None:  # the parent says when: at READY, or (Triton on a GPU) after the first call
        loop.lock = lambda: _lock(spec, known, wfd)
        if job.get("lock_after") != "first_trial":
            loop.lock_now()
    send_message(wfd, {"type": P.READY, "durations": durations, "evidence": loop.evidence()})
    loop.serve()


JOBS = {"reference": run_reference, "candidate": run_candidate, "build": run_build}
