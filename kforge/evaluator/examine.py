"""Drive one candidate child through the protocol and turn what the parent saw into a Verdict.

Stages, each with one budget fixed by the parent when the stage starts (nothing the child sends
extends it): import/compile -> correctness trials (the parent's seeds, in the parent's order, one
answer per request, outputs read by the parent from the arena) -> timed calls on fresh inputs, with the
parent's clock around each, each call's own launch evidence and the outputs of every call read at
secret positions; on a GPU one of them, at a random place, profiled. Among the trials, at a random place,
the decoy trial (Triton: the same problem without the candidate's kernels). Timing runs only for a
correct, unflagged candidate; a flagged correct one gets one profile request (its coverage is still
evidence); on a GPU both with the device's gate held alone (gate.py), the start-up and the trials with it
shared, so no other worker's GPU work runs while this candidate is timed.

What went wrong is the parent's to say, from what it saw: an error, a hang, a crash or a broken protocol
before the child answered its first call is a compile error, whatever the child called it or did. A
Triton kernel compiles at its first launch, and the child's words (an exception's class) are the
candidate's to choose: a try/except could turn a compile failure into a RuntimeError. Only a call that
ran to its answer with a kernel of the candidate's launched on its data shows that the candidate's code
compiled (an answer of zeros without one shows nothing); after one, a runtime error (or timeout, crash),
unless the child claims the lesser compile error.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import time
from concurrent.futures import Future
from typing import Any

from kforge.evaluator import drive
from kforge.evaluator import protocol as P
from kforge.evaluator.arena import Arena
from kforge.evaluator.children import Child
from kforge.evaluator.compare import compare_outputs
from kforge.evaluator.context import PoolContext
from kforge.evaluator.judge import judge_trials, meta_mismatch, shows_compiled
from kforge.evaluator.own_text import candidate_error, own_words
from kforge.evaluator.reference import Reference, decoy_place, fresh_seeds, trial_order
from kforge.evaluator.slot import Slot
from kforge.evaluator.timing_stage import TimingStage
from kforge.evaluator.verdict import Status, Verdict
from kforge.kernel_backends import KERNEL_BACKENDS


class _Stop(Exception):
    """Ends the conversation early with the verdict as it stands."""


class Examination(TimingStage):
    def __init__(self, ctx: PoolContext, slot: Slot, ref: Reference, v: Verdict,
                 drawn: Future[Reference] | None = None) -> None:
        """`ref`: the reference's timing and layout; `drawn`: the same with this evaluation's inputs, still
        being computed while the child starts (None: `ref` holds them)."""
        self.ctx, self.slot, self.ref, self.v = ctx, slot, ref, v
        self.drawn = drawn
        self.cfg = ctx.cfg
        self.durations: dict[str, float] = v.details.setdefault("durations", {})
        self.stage = "import"
        self.child: Child | None = None
        self.ready_evidence: list[dict[str, Any]] = []  # what each child said about itself at READY
        self.profiled = False  # coverage came from one of the timed calls
        # A call ran to its answer with a kernel of the candidate's launched on its data (judge.shows_compiled):
        # the one thing that shows the code compiled.
        self.answered = False
        self.trial_evidence: list[dict[str, Any]] = []  # per trial, what the child reported of its launches

    def run(self, code: str, problem_code: str, backend: str, build_dir: str | None) -> Verdict:
        self.problem_code = problem_code
        rule = KERNEL_BACKENDS[backend]
        self.job = {"code": code, "inputs_code": P.inputs_only(problem_code), "backend": backend,
                    "device": self.slot.device, "init_seed": self.ref.init_seed, "state": self.ref.state,
                    "build_dir": build_dir, "audit_hook": self.cfg.audit_hook,
                    # Triton on a GPU runs ptxas at each kernel's first launch: no exec before that is over
                    # (the first call, examine._first_call; the request is still named for the trial it once was).
                    "lock_after": "first_trial" if rule.compiles_at_first_launch and self.slot.on_gpu else "ready"}
        self.readable = [build_dir] if build_dir else []  # built by a child of its own; read-only from here on
        # The GPU's gate (gate.py): the start-up and the trials share it with the other workers' GPU work,
        # timing has it alone; every hold is released on every path out. A child starts CUDA and puts the
        # model's weights on the device as soon as it is forked, unasked: the start-up's hold comes first.
        # A start-up slot (Slot.starting) first, holding nothing, then the gate; the slot ends at READY.
        _, starting, start_up = self.slot.start_up(self._spawn)
        assert self.child is not None
        self.durations["fork_s"] = self.child.fork_s
        try:
            with start_up:
                with starting:
                    self._import()
                self._first_call()
            self._inputs()  # holding nothing: the draw it waits for needs a hold of its own
            with self.slot.gpu_work():
                self._trials(decoy=rule.decoy and self.ref.decoy is not None)
            if self.v.status is Status.CORRECT:
                with self.slot.timing():
                    if not self.v.flags:
                        started = time.monotonic()
                        self._timing()
                        self._contended(started, time.monotonic())
                    if self._wants_profile() and not self.profiled:
                        self._profile()
            self.child.send({"op": P.OP_BYE})
        except _Stop:
            pass
        except drive.ChildError as exc:
            self._child_error(exc.msg)
        except TimeoutError:
            self._timed_out()
        except EOFError:
            self._died()
        except Exception as exc:  # noqa: BLE001 - a protocol violation, or anything else the child's data raised
            self.v.status = self._failed(Status.CRASHED)
            self.v.flags.append("protocol_violation")
            why = own_words(str(exc)[:200], self.job["code"], self.problem_code)  # it may quote the child
            self.v.details["reason"] = f"the child broke the evaluation protocol ({why or type(exc).__name__})"
        finally:
            start_up.close()  # the start-up slot too, if READY never came
            self.child.close()
        return self.v

    def _spawn(self) -> None:
        """A child (and its own sealed arena) for the job; the one before, if any, is ended."""
        if self.child is not None:
            self.child.close()
        arena = Arena(self.ref.arena_bytes, sealed=True)
        self.child = self.ctx.child(self.slot, "candidate", self.job, readable=self.readable, arena=arena)

    # --- stages ------------------------------------------------------------------------------
    def _import(self) -> None:
        assert self.child is not None
        deadline = time.monotonic() + self.cfg.compile_timeout_s
        applied = drive.ask(self.child, None, "sandbox", deadline)["applied"]
        self.v.details["sandbox"] = {k: (list(x) if isinstance(x, tuple) else x) for k, x in dict(applied).items()}
        ready = drive.ask(self.child, None, P.READY, deadline)
        self.durations.update({k: float(x) for k, x in dict(ready.get("durations") or {}).items()})
        self.v.compile_s += self.durations.get("import_s", 0.0) + self.durations.get("init_s", 0.0)
        self.ready_evidence.append(dict(ready.get("evidence") or {}))
        self._note_lockdown(self.ready_evidence[-1])

    def _first_call(self) -> None:
        """One call on fresh inputs whose outputs nobody reads, while this evaluation's draw of inputs is
        still being computed: Triton compiles a kernel at its first launch (about 1 s on an H100), which
        otherwise waited for the draw. Still the import stage: what fails here never compiled."""
        assert self.child is not None
        t0 = time.monotonic()
        drive.ask(self.child, {"op": P.OP_WARMUP, "seeds": fresh_seeds(1)}, P.WARM, t0 + self.cfg.compile_timeout_s)
        self.durations["first_call_s"] = time.monotonic() - t0
        self.v.compile_s += self.durations["first_call_s"]

    def _note_lockdown(self, evidence: dict[str, Any]) -> None:
        """What the child says it locked down (confine.lock_down), shown with the sandbox's layers."""
        if "lockdown" in evidence:
            self.v.details.setdefault("sandbox", {})["lockdown"] = evidence["lockdown"]

    def _inputs(self) -> None:
        """Wait for this evaluation's draw of inputs (and the reference's outputs on them)."""
        if self.drawn is None:
            return
        try:
            ref = self.drawn.result()
        except Exception as exc:  # noqa: BLE001 - the reference's run, not the candidate's
            ref = dataclasses.replace(self.ref, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        if ref.error:
            self.v.status = Status.RUNTIME_ERROR
            self.v.error = "reference failed: " + ref.error
            self.v.details.update(reason="the problem's reference Model failed; not the candidate's fault",
                                  reference_error=True)
            raise _Stop
        self.ref = ref

    def _trials(self, decoy: bool) -> None:
        """The correctness trials in the parent's order, the decoy trial among them at a random place
        (never first: an autotuner picks its configuration on the first call, not on a skipped one)."""
        assert self.child is not None
        self.stage = "run"
        ref = self.ref
        t0 = time.monotonic()
        deadline = t0 + self.cfg.run_timeout_s
        rng = random.Random()
        order = trial_order(ref, rng)
        answers: list[Any] = [None] * len(order)
        evidence: list[dict[str, Any]] = [{} for _ in order]
        sequence: list[int | None] = list(order)
        if decoy:
            sequence.insert(decoy_place(len(order), rng), None)
        needed = True
        for k in sequence:
            if k is None:
                t1 = time.monotonic()
                needed = self._decoy()
                deadline += time.monotonic() - t1  # the decoy ran on a budget of its own
                continue
            seed, signed = ref.trials[k]
            where = ref.trial_positions[k] if ref.trial_positions is not None else P.ALL
            ans, answers[k] = drive.trial(self.child, k, seed, signed, ref.meta, ref.slots, where, deadline,
                                          check=meta_mismatch)
            evidence[k] = dict(ans.get("evidence") or {})
            self.answered = self.answered or shows_compiled(evidence[k])
            self._note_lockdown(evidence[k])
            if k == order[0]:
                self.durations["first_trial_s"] = time.monotonic() - t0
        self.durations["correctness_s"] = time.monotonic() - t0
        self.trial_evidence = evidence
        f = judge_trials(ref.trials, answers, ref.outputs, evidence + self.ready_evidence, self.cfg)
        v = self.v
        v.trials, v.trials_passed = f.total, f.passed
        v.max_abs_error, v.max_rel_error = f.max_abs, f.max_rel
        v.flags += f.flags
        v.status = Status.CORRECT if f.passed == f.total and f.total else Status.INCORRECT
        if f.reasons:
            v.details["reason"] = f.reasons[0]
            v.error = "\n".join(f.reasons[:3])
        if not needed:
            v.flags.append("kernel_not_needed")
            v.details.setdefault("reason", "the outputs were right with the candidate's kernels skipped")

    def _decoy(self) -> bool:
        """The decoy trial: whether the candidate's kernels were needed. Its own Triton launches are
        skipped (guard.ablate); an answer that is still right came from somewhere else (PyTorch): the
        kernels were for show. The parent reads the answer from the arena. It is one of the trial
        requests, at a place the child cannot predict (the decoy once came last: a candidate could count
        its calls). Only a candidate that notices the skip itself and fails on purpose escapes this.

        A child that broke without its kernels (an error, a hang, a crash) is replaced by a fresh one for
        the remaining trials: what a skipped kernel left behind (garbage indices, a sticky CUDA error)
        must not fail an honest kernel's real trials."""
        assert self.child is not None and self.ref.decoy is not None
        ref = self.ref
        seed, signed = ref.decoy
        where = ref.trial_positions[-1] if ref.trial_positions is not None else P.ALL
        try:
            _, got = drive.trial(self.child, len(ref.trials), seed, signed, ref.meta, ref.slots, where,
                                 time.monotonic() + self.cfg.run_timeout_s, ablate=True, check=meta_mismatch)
        except (drive.ChildError, TimeoutError, EOFError):
            self._spawn()  # it broke without its kernels: they were needed
            self._import()
            self._first_call()  # its lock-down, as for the first child, before any trial
            return True
        return not (isinstance(got, list) and compare_outputs(got, ref.decoy_output, self.cfg, scale_atol=signed).passed)

    # --- endings -----------------------------------------------------------------------------
    def _failed(self, status: Status) -> Status:
        """The status of a failure the parent saw: whatever ended a child before it answered a call with a
        kernel of the candidate's launched on the call's data (an error, a hang, a crash, a broken protocol)
        is a compile error; it never compiled as far as the parent knows, and a candidate must not buy the
        compile reward by hanging, dying, naming its error or answering a call without its kernels."""
        if self.answered:
            return status
        if status is not Status.COMPILE_ERROR and self.stage != "import":
            self.v.details["reason"] = ("no call ran to its answer with a kernel of the candidate's launched on its "
                                        "data, so nothing is known to have compiled")
        return Status.COMPILE_ERROR

    def _child_error(self, msg: dict[str, Any]) -> None:
        assert self.child is not None
        self.v.error = self._own(str(msg.get("message", "")))
        if self.stage == "timing":  # correct before, broken when called again: caching or state
            self.v.flags.append("failed_when_timed")
        else:  # a claim of the lesser compile error is believed; a runtime error only after an answered call
            self.v.status = self._failed(Status.COMPILE_ERROR if msg.get("category") == "compile_error"
                                         else Status.RUNTIME_ERROR)
        if msg.get("stage") == "lockdown":  # a claim against its own interest (confine.StrayThreads)
            self.v.details["reason"] = "a thread it started before the lock-down was still running: refused"

    def _timed_out(self) -> None:
        limits = {"import": self.cfg.compile_timeout_s, "run": self.cfg.run_timeout_s,
                  "timing": self.cfg.timing_timeout_s}
        label = {"import": "Import/compile", "run": "Run", "timing": "Timing"}[self.stage]
        if self.stage == "timing":  # correct, then too slow or stuck when called again
            self.v.flags.append("failed_when_timed")
        else:
            self.v.status = self._failed(Status.TIMEOUT)
        self.v.details["reason"] = f"{label} exceeded {limits[self.stage]:g} s; the process was killed"

    def _died(self) -> None:
        assert self.child is not None
        info = self.child.exit or self.child.wait_exit(2.0) or {}
        sig = info.get("signal")
        if self.stage == "timing":
            self.v.flags.append("failed_when_timed")
        else:
            self.v.status = self._failed(Status.CRASHED)
        if sig:
            self.v.details["reason"] = f"The process died from {signal.Signals(sig).name}"
            if sig == signal.SIGKILL:
                self.v.details["reason"] += " (likely out of memory)"
        else:
            self.v.details["reason"] = f"The process exited with code {info.get('code')} before reporting"
        self.v.error = self._own(self.child.stderr_tail())

    def _own(self, text: str) -> str:
        """What of the child's text may reach a prompt: built from the candidate's own (own_text.py)."""
        return candidate_error(text, self.job["code"], self.problem_code)
