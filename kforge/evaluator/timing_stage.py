"""The timing stage of an Examination (examine.py): warm-up, the timed calls on fresh inputs with the parent's
clock around each, the checks of their outputs and launch evidence, the timing rules, the paired re-measure
before a timing flag (recheck.py) and the profiled share of GPU time.

A mixin: the Examination holds the child, the reference and the verdict; these methods are its timing stage.
"""

from __future__ import annotations

import random
import time
from typing import Any

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import drive
from kforge.evaluator import protocol as P
from kforge.evaluator.children import Child
from kforge.evaluator.context import PoolContext
from kforge.evaluator.judge import (
    check_samples,
    finished_by_pytorch,
    finished_elsewhere_flags,
    timed_evidence_flags,
    timings_from,
)
from kforge.evaluator.recheck import TwinFailed, paired_calls
from kforge.evaluator.reference import BUDGET_MIN_CALLS, Reference, fresh_seeds, timed_order
from kforge.evaluator.slot import Slot
from kforge.evaluator.timing_check import Clock, TimingCheck, check_timing, parent_ms_per_call, recheck_timing
from kforge.evaluator.verdict import Status, Verdict


def wants_profile(v: Verdict, every: bool = True, finished: bool = False) -> bool:
    """Whether a verdict gets its GPU-time coverage measured: a correct one, flagged or not (a flag ends
    timing, not the question how much of the work was the candidate's), unless its child already broke
    when called again, or timing means nothing here (the Triton interpreter); with `every` off
    (`evaluator.coverage`: a profiler start-up costs seconds per child) only one whose outputs PyTorch
    `finished` in its trials, where the judge's own rule needs the share."""
    return (v.status is Status.CORRECT and v.timing_meaningful and "failed_when_timed" not in v.flags
            and (every or finished))


def _share(reported: object) -> float | None:
    """A profiled call's share of GPU time as the child reported it: a number in [0, 1], else not measured."""
    return float(reported) if isinstance(reported, (int, float)) and 0.0 <= reported <= 1.0 else None


class TimingStage:
    """The timing stage's methods; the attributes are the Examination's."""

    ctx: PoolContext
    slot: Slot
    ref: Reference
    v: Verdict
    cfg: EvaluatorConfig
    child: Child | None
    durations: dict[str, float]
    trial_evidence: list[dict[str, Any]]
    profiled: bool
    problem_code: str
    stage: str

    def _contended(self, start: float, end: float) -> None:
        """Name the roles that used this device while the candidate was timed (a skewed speedup)."""
        roles = self.ctx.activity.overlapping(self.slot.index, start, end) if self.ctx.activity else []
        roles += [f"{role} (reference)" for role in self.ref.contended]  # its baseline is skewed too
        if roles:
            self.v.details["timing_contended"] = roles

    def _timing(self) -> None:
        assert self.child is not None
        self.stage = "timing"
        ref, cfg = self.ref, self.cfg
        t0 = time.monotonic()
        deadline = t0 + cfg.timing_timeout_s
        drive.ask(self.child, {"op": P.OP_WARMUP, "seeds": fresh_seeds(cfg.warmup_trials)}, P.WARM, deadline)
        self.durations["warmup_s"] = time.monotonic() - t0
        rng = random.Random()
        # Fresh inputs per call, in an order the child cannot predict; half the checked calls among the first
        # BUDGET_MIN_CALLS, which the time budget never cuts.
        order = timed_order([s is not None for s in ref.samples], BUDGET_MIN_CALLS, rng)
        # The profiled call is one of the timed calls, at a place no count of calls tells (among those the
        # budget never cuts).
        head = min(len(order), BUDGET_MIN_CALLS)
        profile_at = rng.randrange(head) if self._wants_profile() and len(order) > 1 else None
        answers: list[dict[str, Any]] = []
        phases: dict[str, float] = {}
        clock, got = drive.timed_calls(self.child, [ref.timing_seeds[i] for i in order], ref.meta, ref.slots,
                                       [ref.positions[i] for i in order], deadline, profile_at, answers, phases,
                                       budget=(cfg.timing_budget_s, BUDGET_MIN_CALLS))
        self.durations["timing_s"] = time.monotonic() - t0
        self.durations.update({f"timing_{part}_s": s for part, s in phases.items()})
        self.durations["timed_calls"] = len(got)
        order = order[:len(got)]  # the calls made
        if profile_at is not None:
            self.profiled = True
            self.v.coverage = _share(answers[profile_at].get("coverage"))
        # Outputs PyTorch finished, in the trials or in any timed call (a candidate may change course once timed)
        calls = self.trial_evidence + [dict(a.get("evidence") or {}) for a in answers]
        if flags := finished_elsewhere_flags(calls, self.v.coverage, self.slot.on_gpu):
            self.v.flags += flags
            self.v.details["reason"] = "PyTorch made an output and did most of the GPU work (or none was measured)"
        mismatch = check_samples(got, [ref.samples[i] for i in order], cfg)
        if mismatch:
            self.v.flags.append("timed_output_mismatch")
            self.v.details["reason"] = "outputs of the timed calls were wrong: " + mismatch
            return
        if timed_evidence_flags(answers):  # the trials' kernels must be what was timed
            self.v.flags.append("timed_call_without_kernel")
            self.v.details["reason"] = "a timed call ran none of the candidate's kernels on its data"
        if ref.clock is None:
            return
        # The parent's clock counts only calls whose outputs were compared: an unchecked one may have done nothing.
        checked = [ref.samples[i] is not None for k, i in enumerate(order) if k != profile_at]  # (not clocked)
        seen = clock.of(checked) if any(checked) else clock
        self.v.details["parent_ms_per_call"] = parent_ms_per_call(seen, ref.clock)
        self.v.details["reference_overhead_ms"] = ref.clock.overhead_ms  # what that estimate subtracted
        check = check_timing(clock, ref.clock, cfg, self.slot.on_gpu, checked)
        if not check.consistent and check.kernel_ms is not None and not self.v.flags:
            check, again = self._recheck(check, clock)
            if again is not clock:  # re-measured: every paired call was compared
                clock = seen = again
        # What the parent's own clock saw (least wall per call, the reference's over the candidate's), and
        # whether the figure is the clock's floor rather than the report (a report it could not confirm).
        if ref.clock.wall_ms and seen.wall_ms:
            self.v.details["clock_speedup"] = min(ref.clock.wall_ms) / max(min(seen.wall_ms), 1e-9)
        self.v.details["timing_clamped"] = check.clamped
        if not check.consistent:
            self.v.flags.append("timing_inconsistent")
            self.v.details["reason"] = check.reason
        if self.v.flags:
            return
        if self.v.timing_meaningful:
            self.v.timings = timings_from(clock.reported_ms)
            self.v.kernel_ms = check.kernel_ms

    def _recheck(self, first: TimingCheck, clock: Clock) -> tuple[TimingCheck, Clock]:
        """Before a timing flag, the candidate again beside a trusted twin, call by call (recheck.py), up to
        `timing_rechecks` times: the flag stands only if every re-measure shows it too. A load that comes in
        bursts (another pool's big kernels on the same GPU, a CPU spinner) can still tilt 16 pairs once; a
        candidate whose work really falls outside its window is inconsistent in every re-measure. The paired
        calls' outputs and launch evidence are checked like any timed call's; a twin that cannot run leaves
        the finding before it."""
        check, rounds, why = first, 0, None
        while rounds < self.cfg.timing_rechecks and not self.v.flags:
            try:
                check, clock = self._paired()
            except TwinFailed as exc:
                why = str(exc)
                break
            rounds += 1
            if check.consistent:
                break
        self.v.details["recheck"] = {"first": first.reason, "made": rounds > 0, "rounds": rounds,
                                     "consistent": check.consistent, **({"why": why} if why else {})}
        return check, clock

    def _paired(self) -> tuple[TimingCheck, Clock]:
        """One paired re-measure: its check and the candidate's clock. A flag the paired calls earn of their own
        (wrong outputs, no kernel, PyTorch finishing them) is set on the verdict; TwinFailed propagates."""
        assert self.child is not None
        t0 = time.monotonic()
        answers: list[dict[str, Any]] = []
        try:
            mine, twin, got, want = paired_calls(self.ctx, self.slot, self.child, self.problem_code,
                                                 self.ref.init_seed, self.ref.meta, self.ref.slots,
                                                 self.ref.arena_bytes, answers)
        finally:
            self.durations["recheck_s"] = self.durations.get("recheck_s", 0.0) + time.monotonic() - t0
        if mismatch := check_samples(got, want, self.cfg):
            self.v.flags.append("timed_output_mismatch")
            self.v.details["reason"] = "outputs of the re-measured timed calls were wrong: " + mismatch
        elif timed_evidence_flags(answers):
            self.v.flags.append("timed_call_without_kernel")
            self.v.details["reason"] = "a re-measured timed call ran none of the candidate's kernels on its data"
        elif flags := finished_elsewhere_flags([dict(a.get("evidence") or {}) for a in answers], self.v.coverage,
                                               self.slot.on_gpu):  # PyTorch finishing only once re-measured
            self.v.flags += flags
            self.v.details["reason"] = ("PyTorch made an output of a re-measured call and did most of the GPU work "
                                        "(or none was measured)")
        return recheck_timing(mine, twin, self.cfg, self.slot.on_gpu), mine

    def _wants_profile(self) -> bool:
        return wants_profile(self.v, self.cfg.coverage, finished_by_pytorch(self.trial_evidence))

    def _profile(self) -> None:
        """GPU-time coverage of one call, for a correct candidate whose timed calls did not measure it (a
        flagged one is not timed): one whose own kernels did none of the GPU work (decoy.py, flagged
        kernel_not_needed) has coverage 0, not None."""
        assert self.child is not None
        self.stage = "timing"  # a child that breaks here broke when called again: failed_when_timed
        t0 = time.monotonic()
        deadline = t0 + self.cfg.timing_timeout_s
        # A fresh seed: nothing the candidate saw (construction included) tells it this call is profiled.
        prof = drive.ask(self.child, {"op": P.OP_PROFILE, "seed": fresh_seeds(1)[0]}, P.PROFILE, deadline)
        self.durations["profile_s"] = time.monotonic() - t0
        self.v.coverage = _share(prof.get("coverage"))
