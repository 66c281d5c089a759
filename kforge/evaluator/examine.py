"""Drive one candidate child through the protocol and turn what the parent saw into a Verdict.

Stages, each with one budget fixed by the parent when the stage starts (nothing the child sends
extends it): import/compile -> correctness trials (the parent's seeds, in the parent's order,
one answer per request) -> timed batches on fresh inputs, with the parent's clock around each
batch and samples of every timed call's outputs -> profile (GPU). Timing runs only for a correct,
unflagged candidate; on a GPU under the device's timing lock, released on every path.
"""

from __future__ import annotations

import random
import signal
import statistics
import time
from typing import Any

from kforge.evaluator import protocol as P
from kforge.evaluator.children import Child, Slot
from kforge.evaluator.context import PoolContext
from kforge.evaluator.feedback import clean_error
from kforge.evaluator.judge import check_samples, judge_trials, meta_mismatch, parent_ms_per_call, timing_consistent
from kforge.evaluator.reference import Reference, fresh_seeds, timed_batches, trial_order
from kforge.evaluator.verdict import Status, Timings, Verdict

_ERROR_STATUS = {"compile_error": Status.COMPILE_ERROR, "format_error": Status.FORMAT_ERROR}


def timings_from(ms: list[float]) -> Timings | None:
    if not ms:
        return None
    return Timings(median_ms=statistics.median(ms), mean_ms=statistics.fmean(ms),
                   std_ms=statistics.pstdev(ms) if len(ms) > 1 else 0.0, min_ms=min(ms), max_ms=max(ms), trials=len(ms))


class _Stop(Exception):
    """Ends the conversation early with the verdict as it stands."""


class Examination:
    def __init__(self, ctx: PoolContext, slot: Slot, ref: Reference, v: Verdict) -> None:
        self.ctx, self.slot, self.ref, self.v = ctx, slot, ref, v
        self.cfg = ctx.cfg
        self.durations: dict[str, float] = v.details.setdefault("durations", {})
        self.stage = "import"
        self.child: Child | None = None

    def run(self, code: str, problem_code: str, backend: str, build_dir: str | None) -> Verdict:
        job = {"code": code, "inputs_code": P.inputs_only(problem_code), "backend": backend,
               "device": self.slot.device, "init_seed": self.ref.trials[0][0], "state": self.ref.state,
               "build_dir": build_dir, "audit_hook": self.cfg.audit_hook}
        self.child = self.ctx.child(self.slot, "candidate", job, [build_dir] if build_dir else [])
        self.durations["fork_s"] = self.child.fork_s
        try:
            self._import()
            self._trials()
            if self.v.status is Status.CORRECT and not self.v.flags:
                with self.slot.timing():  # a `with`: the lock is released on every path out
                    self._timing()
            self.child.send({"op": P.OP_BYE})
        except _Stop:
            pass
        except TimeoutError:
            self._timed_out()
        except EOFError:
            self._died()
        except Exception as exc:  # noqa: BLE001 - a protocol violation, or anything else the child's data raised
            self.v.status = Status.CRASHED
            self.v.flags.append("protocol_violation")
            self.v.details["reason"] = f"the child broke the evaluation protocol ({str(exc)[:200] or type(exc).__name__})"
        finally:
            self.child.close()
        return self.v

    # --- stages ------------------------------------------------------------------------------
    def _ask(self, request: dict[str, Any] | None, expect: str, deadline: float, bound: int = P.HEADROOM) -> dict[str, Any]:
        assert self.child is not None
        msg = self.child.ask(request, expect, deadline, max(bound, P.HEADROOM))
        if msg["type"] == P.ERROR:
            self.v.status = _ERROR_STATUS.get(str(msg.get("category")), Status.RUNTIME_ERROR)
            self.v.error = clean_error(str(msg.get("message", "")), self.child.scratch, self.ctx.secrets)
            if self.stage == "timing":  # correct before, broken when called again: caching or state
                self.v.status = Status.CORRECT
                self.v.flags.append("failed_when_timed")
            raise _Stop
        return msg

    def _import(self) -> None:
        deadline = time.monotonic() + self.cfg.compile_timeout_s
        applied = self._ask(None, "sandbox", deadline)["applied"]
        self.v.details["sandbox"] = {k: (list(x) if isinstance(x, tuple) else x) for k, x in dict(applied).items()}
        ready = self._ask(None, P.READY, deadline)
        self.durations.update({k: float(x) for k, x in dict(ready.get("durations") or {}).items()})
        self.v.compile_s += self.durations.get("import_s", 0.0) + self.durations.get("init_s", 0.0)
        self.ready_evidence = dict(ready.get("evidence") or {})

    def _trials(self) -> None:
        self.stage = "run"
        t0 = time.monotonic()
        deadline = t0 + self.cfg.run_timeout_s
        order = trial_order(self.ref, random.Random())
        answers: list[Any] = [None] * len(order)
        evidence: list[dict[str, Any]] = [{} for _ in order]
        where = self.ref.trial_positions if self.ref.trial_positions is not None else P.ALL
        for k in order:
            seed, signed = self.ref.trials[k]
            ans = self._ask({"op": P.OP_TRIAL, "id": k, "seed": seed, "signed": signed}, P.TRIAL, deadline)
            evidence[k] = dict(ans.get("evidence") or {})
            # Shapes and dtypes first: only then does the parent accept (and bound) the values.
            answers[k] = meta_mismatch(ans.get("meta"), self.ref.meta)
            if not answers[k]:
                got = self._ask({"op": P.OP_SAMPLE, "positions": where}, P.SAMPLES, deadline,
                                P.answer_bound(self.ref.outputs[k]))
                values = got.get("values")
                answers[k] = list(values[0]) if isinstance(values, list) and len(values) == 1 else "no outputs"
            if k == order[0]:
                self.durations["first_trial_s"] = time.monotonic() - t0
        self.durations["correctness_s"] = time.monotonic() - t0
        f = judge_trials(self.ref.trials, answers, self.ref.outputs, evidence + [self.ready_evidence], self.cfg)
        v = self.v
        v.trials, v.trials_passed = f.total, f.passed
        v.max_abs_error, v.max_rel_error = f.max_abs, f.max_rel
        v.flags += f.flags
        v.status = Status.CORRECT if f.passed == f.total and f.total else Status.INCORRECT
        if f.reasons:
            v.details["reason"] = f.reasons[0]
            v.error = "\n".join(f.reasons[:3])

    def _timing(self) -> None:
        self.stage = "timing"
        ref, cfg = self.ref, self.cfg
        t0 = time.monotonic()
        deadline = t0 + cfg.timing_timeout_s
        self._ask({"op": P.OP_WARMUP, "seeds": fresh_seeds(cfg.warmup_trials)}, P.WARM, deadline)
        order = list(range(len(ref.timing_seeds)))
        random.Random().shuffle(order)  # fresh inputs per call, in an order the child cannot predict
        seeds = [ref.timing_seeds[i] for i in order]
        want = [ref.samples[i] for i in order]
        assert self.child is not None
        clock, got, err = timed_batches(self.child, seeds, ref.batch, ref.positions, deadline,
                                        P.sample_bound(ref.positions, ref.batch))
        if err:
            self.v.flags.append("failed_when_timed")
            self.v.error = clean_error(err, self.child.scratch, self.ctx.secrets)
            raise _Stop
        self.durations["timing_s"] = time.monotonic() - t0
        mismatch = check_samples(got, want, cfg)
        if mismatch:
            self.v.flags.append("timed_output_mismatch")
            self.v.details["reason"] = "outputs of the timed calls were wrong: " + mismatch
            return
        self.v.details["parent_ms_per_call"] = parent_ms_per_call(clock, ref.clock) if ref.clock else None
        if ref.clock is not None and not timing_consistent(clock, ref.clock, cfg, self.slot.on_gpu):
            self.v.flags.append("timing_inconsistent")
            self.v.details["reason"] = (f"the reported times ({statistics.fmean(clock.reported_ms):.4g} ms per call) "
                                        f"disagree with the evaluator's clock "
                                        f"({self.v.details['parent_ms_per_call']:.4g} ms per call)")
            return
        if self.v.timing_meaningful:
            self.v.timings = timings_from(clock.reported_ms)
            prof = self._ask({"op": P.OP_PROFILE, "seed": ref.trials[0][0]}, P.PROFILE, deadline)
            cov = prof.get("coverage")
            self.v.coverage = float(cov) if isinstance(cov, (int, float)) and 0.0 <= cov <= 1.0 else None

    # --- endings -----------------------------------------------------------------------------
    def _timed_out(self) -> None:
        limits = {"import": self.cfg.compile_timeout_s, "run": self.cfg.run_timeout_s,
                  "timing": self.cfg.timing_timeout_s}
        label = {"import": "Import/compile", "run": "Run", "timing": "Timing"}[self.stage]
        if self.stage == "timing":  # correct, then too slow or stuck when called again
            self.v.flags.append("failed_when_timed")
        else:
            self.v.status = Status.TIMEOUT
        self.v.details["reason"] = f"{label} exceeded {limits[self.stage]:g} s; the process was killed"

    def _died(self) -> None:
        assert self.child is not None
        info = self.child.exit or self.child.wait_exit(2.0) or {}
        sig = info.get("signal")
        if self.stage == "timing":
            self.v.flags.append("failed_when_timed")
        else:
            self.v.status = Status.CRASHED
        if sig:
            self.v.details["reason"] = f"The process died from {signal.Signals(sig).name}"
            if sig == signal.SIGKILL:
                self.v.details["reason"] += " (likely out of memory)"
        else:
            self.v.details["reason"] = f"The process exited with code {info.get('code')} before reporting"
        self.v.error = clean_error(self.child.stderr_tail(), self.child.scratch, self.ctx.secrets)
