"""The timing check: a candidate's reported times against the parent's own clock.

A child reports how long each timed call's window took; the parent keeps its own wall time of every call
(request sent -> outputs read) and, where the child marked it, the window's end. This module owns that clock
(`Clock`), the parent's estimates of a call from it (`parent_ms_per_call`, `parent_floor_ms`) and the rules
that read a report against it (`check_timing`, and `recheck_timing` on calls paired with a trusted twin):
whether the report is consistent, and the figure a speedup is computed from, never below what the clock
confirms. Pure functions, like judge.py's: no processes, every rule unit-tested on its own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from kforge.config.schema import EvaluatorConfig


@dataclass
class Clock:
    """One side of a timing measurement, per timed call: the parent's wall time (the `time` request sent
    -> the outputs read from the arena) and the milliseconds the child reported for its window."""

    wall_ms: list[float]
    reported_ms: list[float]
    # Per call, the request -> the child's WINDOW mark (its window ended, the copy-out not begun). Empty in
    # a clock from before the mark existed: then the whole wall stands in for it.
    window_ms: list[float] = field(default_factory=list)

    def of(self, keep: list[bool]) -> Clock:
        """The calls marked in `keep` (one mark per call)."""
        pick = [i for i, k in enumerate(keep) if k]
        return Clock([self.wall_ms[i] for i in pick], [self.reported_ms[i] for i in pick],
                     [self.window_ms[i] for i in pick] if self.window_ms else [])

    @property
    def setup_ms(self) -> float:
        """Per call: the least the parent saw up to the window's end beyond the window itself (request,
        inputs, flush, pipes). It holds no copy-out, so a slack made from it does not grow with the outputs."""
        if len(self.window_ms) != len(self.reported_ms):
            return self.overhead_ms
        return min((w - r for w, r in zip(self.window_ms, self.reported_ms)), default=0.0)

    @property
    def after_ms(self) -> float | None:
        """Per call: the least time from the window's end to the outputs read (copy-out, answer, freeze, read)."""
        if not self.window_ms or len(self.window_ms) != len(self.wall_ms):
            return None
        return min(w - x for w, x in zip(self.wall_ms, self.window_ms))

    @property
    def overhead_ms(self) -> float:
        """Per call: the least the parent saw beyond the reported window (inputs, flush, copy out, pipes,
        freezing, reading). The least, because delays (a freeze landing late, another process on the
        device) only ever add to a call's wall time."""
        if not self.wall_ms:
            return 0.0
        return min(w - r for w, r in zip(self.wall_ms, self.reported_ms))


def parent_ms_per_call(candidate: Clock, reference: Clock) -> float:
    """The parent's own estimate of one candidate call: its least wall time per call less the harness
    overhead measured on the trusted reference doing the same loop. Every timed call's outputs are
    checked, so every call did the whole work (inside its window or not); the least is the call that
    was delayed least. Never below 0 (the two overheads differ by a little noise)."""
    return max(0.0, min(candidate.wall_ms) - reference.overhead_ms) if candidate.wall_ms else 0.0


def parent_floor_ms(candidate: Clock, reference: Clock) -> float:
    """The parent's per-call time of the candidate in the reference's units: the reference's mean report
    times the ratio of the two least wall times per call. Both walls are the same statistic over the same
    loop (request to outputs read), overhead included, so nothing noisy is subtracted: where the kernel
    dominates this is about the candidate's own time; where the loop's overhead dwarfs it (~1 ms around
    a 5 us kernel on an H100) it is about the reference's, since the clock cannot tell the two apart. The
    candidate's own least wall minus the reference's overhead (`parent_ms_per_call`) sank to ~0 there,
    and a report of 0.0001 ms earned a speedup of 905."""
    if not candidate.wall_ms or not reference.wall_ms or min(reference.wall_ms) <= 0.0:
        return 0.0
    return statistics.fmean(reference.reported_ms) * min(candidate.wall_ms) / min(reference.wall_ms)


# On a CPU the Triton interpreter's calls take milliseconds, a handful of calls are timed and the
# machine is shared (the reference's overhead was measured under another load): only a gross
# disagreement (a forged or skipped call) is meaningful there.
CPU_RATIO, CPU_SLACK_MS = 4.0, 10.0
# Share of the reference's per-call overhead (its least wall time per call less its report) added to the
# flag's slack: two children's loops differ by more than a tenth of it on an H100 (an honest 5 us kernel
# in a ~1 ms loop was flagged), so a disagreement smaller than this is noise; the figure's floor still acts.
SLACK_SHARE = 0.5


@dataclass
class TimingCheck:
    """The parent's reading of a candidate's timed calls."""

    kernel_ms: float | None  # the figure a speedup is computed from (None: no usable report)
    consistent: bool
    reason: str = ""
    clamped: bool = False  # the figure is the parent's floor, not the report


def _no_report(reported: list[float], beside: list[list[float]]) -> TimingCheck | None:
    """Unless every call has a finite, positive report and every list beside it one entry per call: no report."""
    n = len(reported)
    if n and all(len(x) == n for x in beside) and all(math.isfinite(x) and x > 0.0 for x in reported):
        return None
    return TimingCheck(None, False, "the reported times must be finite and positive, one per timed call")


def _allowance(cfg: EvaluatorConfig, on_gpu: bool) -> tuple[float, float]:
    """(ratio, slack in ms) of the timing rules: the config's on a GPU, only gross disagreement on a CPU."""
    return (cfg.timing_ratio, cfg.timing_slack_ms) if on_gpu else (CPU_RATIO, CPU_SLACK_MS)


def check_timing(candidate: Clock, reference: Clock, cfg: EvaluatorConfig, on_gpu: bool = True,
                 checked: list[bool] | None = None) -> TimingCheck:
    """The mean of the reported times, compared with the parent's clock and raised to what that clock allows.
    The clock's least times come only from the calls whose outputs were `checked` (all when None): a call
    nobody compared may have computed nothing, and one such call's wall was the least of all, which let every
    report be forged low and set the floor at the loop's bare overhead (a 5 ms kernel's figure 22x).

    - A report that is not finite and positive for every call is no report.
    - Flag (inconsistent): the parent's estimate of the candidate's own time (its least wall time per
      call less the reference's least overhead, `parent_ms_per_call`) exceeds `ratio` x the smaller of
      the report's mean and median + slack (a list skewed so that its mean agrees still fails on its
      median where the clock resolves it). The slack is `timing_slack_ms` + SLACK_SHARE x the reference's
      own per-call overhead: the noise between two children's loops scales with that loop.
    - Figure: the mean report (KernelBench's statistic, the one the baseline is), never below the
      parent's floor over `ratio` (`parent_floor_ms`): the speedup over the reference is at most `ratio`
      x the ratio of the two walls, so work moved out of the window, or a report forged low, gains at
      most `ratio` over what the parent's clock saw however small the kernel; an honest report is the
      figure unless it claims more than the clock can confirm."""
    rep = candidate.reported_ms
    if (bad := _no_report(rep, [candidate.wall_ms])) is not None:
        return bad
    ratio, base = _allowance(cfg, on_gpu)
    if checked is not None and len(checked) == len(rep) and any(checked):
        candidate = candidate.of(checked)
    split = candidate.after_ms is not None and reference.after_ms is not None
    slack = base + SLACK_SHARE * max(reference.setup_ms if split else reference.overhead_ms, 0.0)
    parent = (max(0.0, min(candidate.window_ms) - reference.setup_ms) if split
              else parent_ms_per_call(candidate, reference))
    mean_rep, med_rep = statistics.fmean(rep), statistics.median(rep)
    consistent = parent <= ratio * min(mean_rep, med_rep) + slack
    floor = parent_floor_ms(candidate, reference) / ratio
    reason = "" if consistent else (f"the reported times (mean {mean_rep:.4g}, median {med_rep:.4g} ms per call) "
                                    f"disagree with the evaluator's clock ({parent:.4g} ms per call)")
    # From the window's end to the outputs read, the same copy-out of the same outputs runs for both: what
    # a candidate adds there beyond the loop's slack (no share of the copy-out) is work after its window.
    # On a CPU, where only a gross disagreement means anything, the reference's time is scaled by the ratio.
    if consistent and split and candidate.after_ms > reference.after_ms * (1.0 if on_gpu else ratio) + slack:
        consistent = False
        reason = (f"{candidate.after_ms:.4g} ms per call from the window's end to the outputs read, the reference "
                  f"{reference.after_ms:.4g} ms: work after the window")
    return TimingCheck(max(mean_rep, floor), consistent, reason, clamped=floor > mean_rep)


def recheck_timing(candidate: Clock, twin: Clock, cfg: EvaluatorConfig, on_gpu: bool = True) -> TimingCheck:
    """check_timing's rules on paired calls (recheck.py): call i of the candidate and of a trusted twin ran on
    the same inputs one right after the other, so each pair saw the same load. Medians of the per-pair figures
    replace the least over calls: one delayed pair cannot move a median.

    - Flag when the median over pairs of the candidate's window less the twin's set-up (its window less
      its report) exceeds `ratio` x the report's smaller of mean and median + slack, or when the median
      over pairs of the candidate's time after its window less the twin's exceeds the slack: work after
      the window. Slack: `timing_slack_ms` + SLACK_SHARE x the twin's median set-up; unlike the first check
      on a CPU, the twin's time after the window is not scaled by the ratio (a pair shares its load).
    - Figure: the mean report, never below the twin's mean report x the pairs' median wall ratio / `ratio`."""
    rep = candidate.reported_ms
    if (bad := _no_report(rep, [candidate.wall_ms, candidate.window_ms, twin.wall_ms, twin.window_ms,
                                 twin.reported_ms])) is not None:
        return bad
    ratio, base = _allowance(cfg, on_gpu)
    setup = [w - r for w, r in zip(twin.window_ms, twin.reported_ms)]
    slack = base + SLACK_SHARE * max(statistics.median(setup), 0.0)
    parent = max(0.0, statistics.median(c - s for c, s in zip(candidate.window_ms, setup)))
    mean_rep, med_rep = statistics.fmean(rep), statistics.median(rep)
    consistent, reason = parent <= ratio * min(mean_rep, med_rep) + slack, ""
    if not consistent:
        reason = (f"the reported times (mean {mean_rep:.4g}, median {med_rep:.4g} ms per call) disagree with the "
                  f"evaluator's clock ({parent:.4g} ms per call, paired with the reference)")
    after = statistics.median((cw - cx) - (tw - tx) for cw, cx, tw, tx
                              in zip(candidate.wall_ms, candidate.window_ms, twin.wall_ms, twin.window_ms))
    if consistent and after > slack:
        consistent = False
        reason = (f"{after:.4g} ms per call more than the reference from the window's end to the outputs read, "
                  f"paired call by call: work after the window")
    walls = statistics.median(c / t for c, t in zip(candidate.wall_ms, twin.wall_ms)) if min(twin.wall_ms) > 0 else 0.0
    floor = statistics.fmean(twin.reported_ms) * walls / ratio
    return TimingCheck(max(mean_rep, floor), consistent, reason, clamped=floor > mean_rep)
