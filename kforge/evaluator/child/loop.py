"""The request loop of a child (see protocol.py), shared by the reference and the candidate.

The child decides nothing. It builds the inputs the parent names (a seed), runs the model, copies the
outputs whole into the arena slots the parent names and answers; the parent reads the values itself.
Everything this process reports about itself (launches, timings, patched functions, refused audit
events) is evidence the parent may use to add flags, never to remove one: the candidate's code runs
here and can rewrite any of it.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
import types
from typing import Any, Callable, Iterator

import torch

from kforge.evaluator import protocol as P
from kforge.evaluator.child import guard as guard_mod
from kforge.evaluator.child.arena_writer import ArenaWriter
from kforge.evaluator.child.coverage import kernel_coverage, kernel_times
from kforge.evaluator.child.isolation import MODE_LEFT, SEAL_BROKEN, DispatchSeal, harness_only, modes
from kforge.evaluator.child.written import Written, storage_ranges
from kforge.evaluator.wire import read_pickle_blocking, send_message

# Bound before any candidate code runs: the loop times and syncs through these.
_perf = time.perf_counter
_no_grad = torch.no_grad
# What the loop uses once the candidate's code ran, bound before any of it runs: a name replaced in torch's
# own dict later (a route no frozen module sees) changes nothing here.
_equal, _synchronize, _Tensor, _Event = torch.equal, torch.cuda.synchronize, torch.Tensor, torch.cuda.Event
_profile, _ProfilerActivity = torch.profiler.profile, torch.profiler.ProfilerActivity


@contextlib.contextmanager
def _signed_rand() -> Iterator[None]:
    """Inside get_inputs(): torch.rand -> torch.randn, so [0,1) inputs become signed."""
    saved = torch.rand, torch.rand_like
    torch.rand, torch.rand_like = torch.randn, torch.randn_like  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.rand, torch.rand_like = saved  # type: ignore[assignment]


def _device_context(device: str) -> contextlib.nullcontext[None] | torch.device:
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
    return [x.to(device) if isinstance(x, _Tensor) else x for x in inputs]


def _flatten(out: object) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _meta(out: list[Any]) -> list[Any]:
    return [[list(o.shape), str(o.dtype)] if isinstance(o, _Tensor) else None for o in out]


def _plain(out: list[Any]) -> list[Any]:
    """Non-tensor outputs travel in the answer (as plain JSON values; anything else as text)."""
    return [None if isinstance(o, _Tensor) else o for o in out]


def category(exc: BaseException) -> str:
    """What the child says went wrong; the parent only believes a claim against the candidate's interest."""
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"CompilationError", "CompileTimeAssertionFailure", "SyntaxError", "ImportError"}:
        return "compile_error"
    return "runtime_error"


def send_error(wfd: int, stage: str, category_: str, exc: BaseException | None = None, text: str = "") -> None:
    if exc is not None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-12:])
    send_message(wfd, {"type": P.ERROR, "stage": stage, "category": category_, "message": text[-6000:]})


class RequestLoop:
    """The request loop; the candidate's adds evidence (`guard`) and identity checks (`changed`)."""

    def __init__(self, model: torch.nn.Module, problem: types.ModuleType, device: str, wfd: int, rfd: int, arena_fd: int | None,
                 guard: guard_mod.Guard | None = None, changed: Callable[[], list[str]] | None = None,
                 seal: DispatchSeal | None = None, baseline: tuple[object, ...] | None = None) -> None:
        self.model, self.problem, self.device = model, problem, device
        # Taken before the candidate's code ran (the harness passes them): the dispatcher's kernels for the
        # ops the harness uses, and the modes entered then (none of the candidate's, at import or later).
        self.seal, self.baseline = seal, modes() if baseline is None else baseline
        self.wfd, self.rfd = wfd, rfd
        self.guard, self.changed = guard, changed
        self.on_gpu = device.startswith("cuda")
        self.sync: Callable[[], None] = _synchronize if self.on_gpu else (lambda: None)
        self.arena = ArenaWriter(arena_fd, self.on_gpu)
        self.flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device) if self.on_gpu else None
        self.kept: Any = None  # the last call's inputs and outputs, let go at the next request
        self.lock: Callable[[], dict[str, Any]] | None = None  # confine.lock_down, applied once
        self.locked: dict[str, Any] | None = None

    def lock_now(self) -> None:
        if self.lock is not None and self.locked is None:
            self.locked = self.lock()

    def evidence(self) -> dict[str, Any]:
        if self.guard is None:
            return {}
        ev = {"denied": sorted(set(self.guard.denied)), "patched": self.changed() if self.changed else []}
        return ev | ({"lockdown": self.locked} if self.locked is not None else {})

    def call(self, inputs: list[Any], check: bool = True) -> list[Any]:
        """The model on `inputs`, synchronised; `check=False` (a timed call) leaves `check_harness` to after
        the window."""
        with _no_grad():
            out = _flatten(self.model(*inputs))
        if check:
            self.check_harness()
        # Only plain tensors hold their values once the call returns: a subclass could compute lazily,
        # later, and only the elements someone reads.
        for o in out:
            if isinstance(o, _Tensor) and type(o) is not _Tensor:
                raise TypeError(f"outputs must be plain torch.Tensor objects, not {type(o).__name__}")
        self.sync()
        return out

    def check_harness(self) -> None:
        """A mode left entered (a suspended generator's `with`, at import or in forward) would see the torch
        calls the harness makes next; a kernel registered for an op the harness uses would run inside them.
        The reference's loop runs the same (its seal is never broken), so a timed call's time after its window
        costs both sides alike."""
        if modes() != self.baseline:
            raise RuntimeError(MODE_LEFT)
        if self.seal is not None and not self.seal.intact():
            raise RuntimeError(SEAL_BROKEN)

    def trial(self, req: dict[str, Any]) -> dict[str, Any]:
        inputs = make_inputs(self.problem, int(req["seed"]), bool(req["signed"]), self.device)
        start = len(self.guard.launches) if self.guard else 0
        if self.guard is not None:
            self.guard.held = []
            self.guard.ablate = bool(req.get("ablate"))
            self.guard.written = Written(self.sync, self.on_gpu, self.seal)  # what each launch left (written.py)
        try:
            out = self.call(inputs)
        finally:
            if self.guard is not None:
                self.guard.ablate = False
        self.kept = (inputs, out)  # as in a timed call: let go only once the parent has read them
        with harness_only():
            return self._trial_answer(req, inputs, out, start)

    def _trial_answer(self, req: dict[str, Any], inputs: list[Any], out: list[Any], start: int) -> dict[str, Any]:
        self.arena.put(out, req.get("slots"), req.get("size", 0))
        msg: dict[str, Any] = {"type": P.TRIAL, "id": req["id"], "meta": _meta(out), "plain": _plain(out)}
        if self.guard is not None:
            in_ranges, out_ranges = storage_ranges(inputs), storage_ranges(out)
            ev = guard_mod.summarize(self.guard.launches[start:], in_ranges + out_ranges, out_ranges)
            ev["outputs_overwritten"] = self.guard.written.overwritten(out)
            self.guard.written = None
            ev["aliases_input"] = any(a < e and s < b for a, b in out_ranges for s, e in in_ranges)
            ev["equals_input"] = any(isinstance(o, _Tensor) and isinstance(x, _Tensor) and x.shape == o.shape
                                     and x.dtype == o.dtype and bool(_equal(x, o)) for o in out for x in inputs)
            msg["evidence"] = ev | self.evidence()
            self.guard.held = None
            del self.guard.launches[start:]  # evidence taken; timed calls must not grow the record
        else:  # the trusted reference says whether its inputs lie in [0, 1) (then a signed trial is added)
            floats = [x for x in inputs if isinstance(x, _Tensor) and x.is_floating_point() and x.numel()]
            msg["unit"] = bool(floats) and all(float(x.min()) >= 0.0 and float(x.max()) < 1.0 for x in floats)
        return msg

    def warmup(self, req: dict[str, Any]) -> dict[str, Any]:
        for seed in req["seeds"]:
            self.call(make_inputs(self.problem, int(seed), False, self.device))
        return {"type": P.WARM}

    def timed(self, req: dict[str, Any]) -> dict[str, Any]:
        """One call on fresh inputs; the window holds the call and a whole-device sync. The child tells the
        parent the window ended (WINDOW), copies the outputs to the arena and answers with the call's
        launch evidence. With `profile` (a timed call the parent picked at random: no count tells which)
        the call runs under the profiler and its time is not used. Inputs and outputs stay referenced
        until the next request: nothing the candidate hangs on them (a weakref callback) runs before the
        parent read them."""
        if self.guard is not None:
            del self.guard.launches[:]
            self.guard.held = []
        inputs = make_inputs(self.problem, int(req["seed"]), False, self.device)
        ms: float | None = None
        cov: float | None = None
        if req.get("profile"):
            out, cov = self._profiled(inputs)
        else:
            if self.flush is not None:
                self.flush.zero_()
            self.sync()
            if self.on_gpu:
                start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                start.record()
                out = self.call(inputs, check=False)
                end.record()
                end.synchronize()
                ms = float(start.elapsed_time(end))
            else:
                t0 = _perf()
                out = self.call(inputs, check=False)
                ms = (_perf() - t0) * 1e3
        send_message(self.wfd, {"type": P.WINDOW})
        self.kept = (inputs, out)
        if not req.get("profile"):
            self.check_harness()
        with harness_only():
            self.arena.put(out, req.get("slots"), req.get("size", 0))
            msg: dict[str, Any] = {"type": P.TIMED, "ms": ms, "plain": _plain(out), "coverage": cov}
            if self.guard is not None:
                out_ranges = storage_ranges(out)
                msg["evidence"] = guard_mod.summarize(self.guard.launches, storage_ranges(inputs) + out_ranges, out_ranges)
                self.guard.held = None
                del self.guard.launches[:]
        return msg

    def _profiled(self, inputs: list[Any]) -> tuple[list[Any], float | None]:
        """One call under the profiler: its outputs, and the share of GPU time in the candidate's kernels."""
        if not self.on_gpu or self.guard is None:
            return self.call(inputs), None
        start = len(self.guard.launches)
        with _profile(activities=[_ProfilerActivity.CUDA]) as prof:
            out = self.call(inputs)
        names = {launch.name for launch in self.guard.launches[start:] if launch.candidate and launch.name}
        names |= self.guard.cuda_kernels
        return out, kernel_coverage(kernel_times(prof.key_averages()), names, self.guard.cuda_namespaces)

    def profile(self, req: dict[str, Any]) -> dict[str, Any]:
        """A flagged candidate's coverage (it is not timed): one call under the profiler."""
        _, cov = self._profiled(make_inputs(self.problem, int(req["seed"]), False, self.device))
        return {"type": P.PROFILE, "coverage": cov}

    def serve(self) -> None:
        handlers = {P.OP_TRIAL: self.trial, P.OP_WARMUP: self.warmup, P.OP_TIME: self.timed,
                    P.OP_PROFILE: self.profile}
        while True:
            req = read_pickle_blocking(self.rfd)
            self.kept = None  # the last call's inputs and outputs go now: the parent has read that call
            op = req.get("op")
            if op == P.OP_COMPILE:  # reference only: the torch.compile baseline
                self.model = torch.compile(self.model)
                continue
            if op not in handlers:  # OP_BYE
                return
            collecting = gc.isenabled()
            gc.disable()  # no finaliser runs from a window's end to the answer (a cycle's weakref callback)
            try:
                msg = handlers[op](req)
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                send_error(self.wfd, op, category(exc), exc)
                return
            send_message(self.wfd, msg)
            if collecting:
                gc.enable()
            self.lock_now()  # a no-op once applied; Triton on a GPU compiled its kernels in the first call
