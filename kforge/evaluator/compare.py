"""Output comparison, done in the trusted parent: shapes, dtypes, NaN/Inf, per-dtype tolerances."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kforge.config.schema import EvaluatorConfig


@dataclass
class TrialResult:
    passed: bool
    reason: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0


def tolerance(dtype: torch.dtype, cfg: EvaluatorConfig) -> tuple[float, float]:
    """(atol, rtol) for an output dtype; integers and booleans must match exactly. A complex dtype gets
    the tolerance of its parts (complex64: float32's)."""
    if dtype.is_complex:
        dtype = dtype.to_real()
    if dtype in (torch.float16, torch.bfloat16):
        return cfg.atol_half, cfg.rtol_half
    if dtype == torch.float64:
        return min(cfg.atol_fp32, 1e-6), min(cfg.rtol_fp32, 1e-6)
    if dtype.is_floating_point:
        return cfg.atol_fp32, cfg.rtol_fp32
    return 0.0, 0.0


def _parts(t: torch.Tensor) -> torch.Tensor:
    """The values to compare, in float64: a complex tensor's real and imaginary parts side by side."""
    return torch.view_as_real(t.resolve_conj()).double() if t.is_complex() else t.double()


def compare_outputs(got: list[Any], want: list[Any], cfg: EvaluatorConfig, scale_atol: bool = False) -> TrialResult:
    """`scale_atol`: the absolute tolerance is multiplied by the reference's RMS magnitude (at least 1).
    Used for the extra signed-input trial: a long fp32 reduction over signed values lands near zero with
    rounding error proportional to the summands, which a fixed 1e-4 atol would fail; zero, copy and
    constant outputs are still off by the order of the outputs themselves and fail."""
    if not isinstance(got, list) or len(got) != len(want):
        n = len(got) if isinstance(got, list) else "?"
        return TrialResult(False, f"returned {n} outputs, expected {len(want)}")
    worst_abs = worst_rel = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        where = f"output {i}: " if len(want) > 1 else ""
        if not isinstance(w, torch.Tensor):
            if g != w:  # the child's value is not shown: its text (or digits) could be anything it read
                return TrialResult(False, f"{where}a {type(g).__name__} value != expected {w!r}")
            continue
        if not isinstance(g, torch.Tensor):
            return TrialResult(False, f"{where}expected a tensor, got {type(g).__name__}")
        if g.shape != w.shape:
            return TrialResult(False, f"{where}shape {tuple(g.shape)} != expected {tuple(w.shape)}")
        if g.dtype != w.dtype:
            return TrialResult(False, f"{where}dtype {g.dtype} != expected {w.dtype}")
        if g.is_floating_point() or g.is_complex():
            bad = ~torch.isfinite(g) & torch.isfinite(w)
            if bool(bad.any()):
                return TrialResult(False, f"{where}{int(bad.sum())} NaN/Inf values where the reference is finite")
            atol, rtol = tolerance(w.dtype, cfg)
            # double() of a complex tensor keeps only its real part: a kernel that left every imaginary
            # part 0 passed. Real and imaginary parts are compared as values of their own.
            g64, w64 = _parts(g), _parts(w)
            finite = torch.isfinite(w64)
            if scale_atol and w64.numel():
                rms = float(w64.where(finite, torch.zeros((), dtype=torch.float64)).pow(2).mean().sqrt())
                atol = atol * max(1.0, rms)
            diff = (g64 - w64).abs().where(finite, torch.zeros((), dtype=torch.float64))
            max_abs = float(diff.max()) if diff.numel() else 0.0
            rel = diff / w64.abs().clamp_min(1e-12)
            max_rel = float(rel.max()) if rel.numel() else 0.0
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            nonfinite_mismatch = bool((~finite & ~(g64 == w64) & ~(torch.isnan(g64) & torch.isnan(w64))).any())
            if nonfinite_mismatch or bool((diff > atol + rtol * w64.abs()).any()):
                frac = float((diff > atol + rtol * w64.abs()).double().mean()) if diff.numel() else 0.0
                return TrialResult(False, f"{where}max abs error {max_abs:.3g} (atol {atol:g}, rtol {rtol:g}); "
                                   f"{frac:.1%} of values out of tolerance", max_abs, max_rel)
        else:
            if not torch.equal(g, w):
                return TrialResult(False, f"{where}{int((g != w).sum())} values differ (exact match required)")
    return TrialResult(True, "", worst_abs, worst_rel)


def identical(a: list[Any], b: list[Any]) -> bool:
    """Exactly the same outputs (used to spot memoised or constant results across trials)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True
