"""Pure judging functions of the parent: trials, evidence, timed-call samples and the speedup rule (the
timing check, the parent's clock against the child's reports, is timing_check.py's).

No processes here: each function takes what the parent holds (reference outputs, the child's answers,
its timings) and returns findings, so every rule is unit-tested on its own.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import protocol as P
from kforge.evaluator.compare import TrialResult, compare_outputs, identical
from kforge.evaluator.verdict import Timings, Verdict


@dataclass
class TrialFindings:
    passed: int = 0
    total: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    reasons: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def judge_trials(trials: list[tuple[int, bool]], answers: list[Any], expected: list[list[Any]],
                 evidence: list[dict[str, Any]], cfg: EvaluatorConfig) -> TrialFindings:
    """Compare the answer to each trial the parent chose with the reference outputs for it (whole,
    or at the same positions for large outputs). An answer given as a string failed before its
    values were asked (wrong count, shape or dtype): the string says why."""
    f = TrialFindings(total=len(trials))
    for i, ((_seed, signed), got, want) in enumerate(zip(trials, answers, expected)):
        res = TrialResult(False, got) if isinstance(got, str) else compare_outputs(got, want, cfg, scale_atol=signed)
        f.passed += res.passed
        f.max_abs, f.max_rel = max(f.max_abs, res.max_abs), max(f.max_rel, res.max_rel)
        if not res.passed:
            f.reasons.append(("signed-input trial: " if signed else f"trial {i + 1}: ") + res.reason)
            if evidence[i].get("equals_input"):
                f.flags.append("returns_input")
    # The same outputs for different inputs: memoised or constant, whatever the tolerance said.
    for i in range(1, len(answers)):
        if isinstance(answers[i - 1], str) or isinstance(answers[i], str):
            continue
        if identical(answers[i - 1], answers[i]) and not identical(expected[i - 1], expected[i]):
            f.flags.append("identical_outputs_across_trials")
            break
    f.flags += flags_from_evidence(evidence)
    return f


def shows_compiled(evidence: dict[str, Any]) -> bool:
    """Whether an answered trial shows the parent that the candidate's code compiled: its evidence holds a
    launch of the candidate's own kernel, returned, on the call's data (Triton compiles at the first launch; a
    CUDA extension's function ran, built by its build child). An answer alone shows nothing: a first call
    answered with zeros and no kernel, then a kernel that does not compile, was `runtime_error`. The
    evidence is the candidate's to forge only with the in-process layers broken, and under-reporting only
    costs it the compile reward."""
    return int(evidence.get("kernels_on_data", 0) or 0) > 0


def timed_evidence_flags(answers: list[dict[str, Any]]) -> list[str]:
    """`timed_call_without_kernel` when a timed call's own launch evidence shows no kernel of the candidate's
    on its data, or an output none of them wrote: the trials' kernels must be what was timed (a candidate
    that counts its calls answered the timed ones with PyTorch alone). An answer without evidence shows none."""
    for ans in answers:
        ev = ans.get("evidence")
        ev = ev if isinstance(ev, dict) else {}
        if int(ev.get("kernels_on_data", 0) or 0) == 0 or int(ev.get("outputs_unwritten", 0) or 0) > 0:
            return ["timed_call_without_kernel"]
    return []


# A correct candidate whose outputs PyTorch finished (guard.EPILOGUE_RATIO: small outputs no kernel of its own
# wrote) must show, in the profiled call, that its own kernels took at least this share of the GPU time: a
# loss kernel that sums on the GPU and divides in PyTorch is near 1; a copy kernel followed by PyTorch's own
# reduction of the copy is near or under half. On a GPU a share that was not measured counts as too small (a
# profiled call that fails must not excuse the output); on a CPU, where nothing measures it, nothing is flagged.
EPILOGUE_MIN_SHARE = 0.5


def finished_by_pytorch(evidence: list[dict[str, Any]]) -> bool:
    """Whether any call's evidence shows a small output PyTorch made from its kernels' results (EPILOGUE_RATIO)."""
    return any(int(ev.get("outputs_finished", 0) or 0) > 0 for ev in evidence)


def finished_elsewhere_flags(evidence: list[dict[str, Any]], coverage: float | None, on_gpu: bool) -> list[str]:
    """`output_not_from_kernel` for a candidate whose small outputs PyTorch made (in any call's evidence) while
    its own kernels did less than EPILOGUE_MIN_SHARE of the GPU time, or no share was measured on a GPU."""
    if not (finished_by_pytorch(evidence) and on_gpu):
        return []
    return ["output_not_from_kernel"] if coverage is None or coverage < EPILOGUE_MIN_SHARE else []


def flags_from_evidence(evidence: list[dict[str, Any]]) -> list[str]:
    """Flags from what the child reported about itself. Evidence may add flags, never remove one."""
    flags: list[str] = []
    for ev in evidence:
        if "kernels" not in ev:  # not a trial's evidence (e.g. what the child said after import)
            pass
        elif int(ev.get("kernels", 0) or 0) == 0:
            flags.append("no_kernel_launched")
        elif int(ev.get("kernels_on_data", 0) or 0) == 0:
            flags.append("kernel_not_on_trial_data")
        elif int(ev.get("outputs_unwritten", 0) or 0) > 0:
            flags.append("output_not_from_kernel")
        if int(ev.get("outputs_overwritten", 0) or 0) > 0:  # its bytes changed after the kernel's last launch on it
            flags.append("output_not_from_kernel")
        if ev.get("aliases_input"):
            flags.append("output_aliases_input")
        flags += [p if p in _PATCHED else "patched:unknown" for p in ev.get("patched", []) or []]
        flags += [f"sandbox_denied:{d if d in _DENIED else 'unknown'}" for d in ev.get("denied", []) or []]
    return sorted(set(flags))


# The names a flag from evidence may carry (the child's text otherwise: it reaches the prompt's feedback).
_PATCHED = frozenset(f"patched:{name}" for name in P.WATCHED + P.LAUNCHERS)
_DENIED = P.DENIED_EVENTS | P.CODE_EVENTS | P.MODULE_EVENTS | {"open:fd"}


def _numel(m: list[Any] | None) -> int:
    n = 1
    for d in (m[0] if m else []):
        n *= int(d)
    return n if m else 0


def sample_positions(meta: list[Any], points: int, gen: torch.Generator) -> list[torch.Tensor | None]:
    """Random flat positions per output ([shape, dtype] each), drawn by the parent and revealed only
    after a timed batch."""
    return [torch.randint(0, _numel(m), (min(points, _numel(m)),), generator=gen) if _numel(m) else None
            for m in meta]


EDGE = 4096  # first and last values of a large output, always compared (tails are where bugs live)


def meta_bytes(meta: list[Any]) -> int:
    """Bytes of the outputs a TRIAL answer describes ([shape, dtype] per output)."""
    return sum(_numel(m) * getattr(torch, str(m[1]).removeprefix("torch."), torch.float64).itemsize
               for m in meta if m)


def compare_positions(meta: list[Any], points: int, gen: torch.Generator) -> list[torch.Tensor | None]:
    """For outputs too large to move: the first and last EDGE values plus `points` random ones."""
    out: list[torch.Tensor | None] = []
    for m in meta:
        n = _numel(m)
        if n == 0:
            out.append(None)
            continue
        edges = torch.cat([torch.arange(min(EDGE, n)), torch.arange(max(0, n - EDGE), n)])
        out.append(torch.cat([edges, torch.randint(0, n, (points,), generator=gen)]))
    return out


def meta_mismatch(got: object, want: list[Any]) -> str:
    """'' when the answer's outputs have the reference's count, shapes and dtypes."""
    if not isinstance(got, list) or len(got) != len(want):
        return f"returned {len(got) if isinstance(got, list) else '?'} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"output {i}: " if len(want) > 1 else ""
        if (g is None) != (w is None):
            return f"{where}expected {'a tensor' if w else 'a plain value'}"
        if w is not None and (list(g[0]) != list(w[0]) or str(g[1]) != str(w[1])):
            return f"{where}shape {_said(g, w)} != expected {tuple(w[0])} {w[1]}"
    return ""


def _said(got: object, want: list[Any]) -> str:
    """The shape and dtype the child claimed, as the parent writes them: no number larger than the expected
    output's size (`#`), no more dimensions than it has and two, a dtype only when torch has one by that name.
    The claim is the child's text and reaches the prompt (a shape's digits could spell what it read)."""
    size = max(1, math.prod(int(d) for d in want[0]))
    dims = got[0] if isinstance(got, (list, tuple)) and len(got) == 2 and isinstance(got[0], list) else []
    shown = [str(d) if type(d) is int and 0 <= d <= size else "#" for d in dims[:len(want[0]) + 2]]
    dtype = str(got[1]) if isinstance(got, (list, tuple)) and len(got) == 2 else ""
    known = isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype)
    return "(" + ", ".join(shown) + ("," if len(shown) == 1 else "") + ")" + (f" {dtype}" if known else " ?")


def check_samples(got: list[list[Any]], want: list[list[Any] | None], cfg: EvaluatorConfig) -> str:
    """'' when every checked timed call's sampled outputs match the reference's for the same inputs (a call
    whose reference values a draw did not compute, None, is read like the others and not compared)."""
    if len(got) != len(want):
        return f"answered for {len(got)} timed calls, {len(want)} were made"
    for j, (g, w) in enumerate(zip(got, want)):
        if w is None:
            continue
        res = compare_outputs(list(g) if isinstance(g, list) else g, w, cfg)
        if not res.passed:
            return f"timed call {j + 1}: {res.reason}"
    return ""


def timings_from(ms: list[float]) -> Timings | None:
    if not ms:
        return None
    return Timings(median_ms=statistics.median(ms), mean_ms=statistics.fmean(ms),
                   std_ms=statistics.pstdev(ms) if len(ms) > 1 else 0.0, min_ms=min(ms), max_ms=max(ms), trials=len(ms))


def file_timings(entry: dict[str, float] | None) -> Timings | None:
    """A baseline file's entry (`problems.baseline.lookup`) as Timings; the file gives no median, so the mean."""
    if entry is None:
        return None
    return Timings(median_ms=entry["mean"], mean_ms=entry["mean"], std_ms=entry["std"], min_ms=entry["min"],
                   max_ms=entry["max"], trials=int(entry["num_trials"]))


def judge_speed(v: Verdict, file_baseline: Timings | None, reference_ms: dict[str, list[float]], mode: str) -> None:
    """Set the verdict's baseline and speedup: a baseline file's entry first, else the reference's own timed
    calls in `mode` (eager when that mode was not timed). Only a meaningfully timed verdict gets either."""
    if v.timings is None or not v.timing_meaningful:
        return
    base = file_baseline or timings_from(reference_ms.get(mode, []) or reference_ms.get("eager", []))
    v.baseline = base
    if base is not None and v.kernel_ms:  # the same statistic on both sides: the mean
        v.speedup = base.mean_ms / v.kernel_ms
