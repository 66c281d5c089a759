"""The judge's pure parts: parent-side rules, the wire, the static bans, the protocol's problem text."""

from __future__ import annotations

import os
import statistics
import struct

import pytest
import torch

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import protocol as P
from kforge.evaluator.child.coverage import cuda_kernel_names, is_own, kernel_coverage, qualified_name
from kforge.evaluator.judge import (
    EDGE,
    check_samples,
    compare_positions,
    flags_from_evidence,
    judge_trials,
    meta_bytes,
    meta_mismatch,
    sample_positions,
    timed_evidence_flags,
)
from kforge.evaluator.static.static_check import check_source
from kforge.evaluator.timing_check import Clock, check_timing, parent_ms_per_call, recheck_timing
from kforge.evaluator.wire import FrameReader, WireError, decode, encode, send_frame
from locations import CANDIDATES, REPO

RELU = (CANDIDATES / "manifest.py").read_text().split("RELU = '''")[1].split("'''")[0]
GOOD = (CANDIDATES / "relu_correct.py").read_text()
CUDA_RELU = (CANDIDATES / "cuda_relu_correct.py").read_text()


# --- timing: the parent's clock against the child's report -------------------------------------

def _consistent(cand: Clock, ref: Clock, cfg: EvaluatorConfig, on_gpu: bool = True) -> bool:
    return check_timing(cand, ref, cfg, on_gpu).consistent


def test_parent_estimate_subtracts_the_harness_overhead_measured_on_the_reference() -> None:
    ref = Clock(wall_ms=[3.0] * 10, reported_ms=[2.0] * 10)  # 3 ms per call seen, 2 ms reported: 1 ms overhead
    cand = Clock(wall_ms=[1.6] * 10, reported_ms=[0.6] * 10)  # 1.6 ms per call seen
    assert parent_ms_per_call(cand, ref) == pytest.approx(0.6)
    check = check_timing(cand, ref, EvaluatorConfig())
    assert check.consistent and check.kernel_ms == pytest.approx(0.6)  # an honest report is the figure


def test_forged_or_skipped_timings_are_inconsistent() -> None:
    cfg = EvaluatorConfig(timing_ratio=1.5, timing_slack_ms=0.02)
    ref = Clock(wall_ms=[3.0] * 10, reported_ms=[2.0] * 10)
    forged = Clock(wall_ms=[1.6] * 10, reported_ms=[0.0001] * 10)  # did 0.6 ms of work per call, claims 0.0001
    assert not _consistent(forged, ref, cfg)
    # Just inside the allowance: 0.6 <= 1.5 * 0.06 + 0.02 + 0.5 * 1.0 (half the reference's overhead).
    assert _consistent(Clock([1.6] * 10, [0.06] * 10), ref, cfg)
    assert not _consistent(Clock([1.6] * 10, [0.05] * 10), ref, cfg)


@pytest.mark.parametrize("reported", [[], [0.5] * 9, [0.5] * 9 + [-0.5], [0.5] * 9 + [float("nan")],
                                      [0.5] * 9 + [float("inf")], [0.5] * 9 + [0.0]])
def test_reports_must_be_finite_positive_and_one_per_call(reported: list[float]) -> None:
    ref = Clock(wall_ms=[3.0] * 10, reported_ms=[2.0] * 10)
    check = check_timing(Clock([1.6] * 10, reported), ref, EvaluatorConfig())
    assert not check.consistent and check.kernel_ms is None and "finite and positive" in check.reason


def test_a_skewed_report_whose_mean_agrees_fails_the_median() -> None:
    ref = Clock(wall_ms=[3.0] * 10, reported_ms=[2.0] * 10)
    honest = Clock(wall_ms=[6.0] * 10, reported_ms=[5.0] * 10)
    skewed = Clock(wall_ms=[6.0] * 10, reported_ms=[0.01] * 9 + [49.91])  # same sum, tiny median
    assert _consistent(honest, ref, EvaluatorConfig())
    assert not _consistent(skewed, ref, EvaluatorConfig())
    assert check_timing(skewed, ref, EvaluatorConfig()).kernel_ms == pytest.approx(5.0)  # the mean, never the median


def test_the_figure_never_beats_the_parents_clock_by_more_than_the_ratio() -> None:
    cfg = EvaluatorConfig()  # ratio 2
    # A 0.05 ms reference in a loop that costs 0.3 ms per call around it.
    ref = Clock(wall_ms=[0.35] * 100, reported_ms=[0.05] * 100)
    # All of a 0.05 ms kernel's work moved out of its window: it reports 0.001 ms; within the flag's slack.
    moved = Clock(wall_ms=[0.35] * 100, reported_ms=[0.001] * 100)
    check = check_timing(moved, ref, cfg)
    assert check.consistent  # too small for the clock to call it a forgery...
    assert 0.05 / check.kernel_ms == pytest.approx(2.0)  # ...but the speedup is what the clock allows: 2x
    honest = Clock(wall_ms=[0.33] * 100, reported_ms=[0.03] * 100)  # truly 1.67x faster: kept as reported
    assert check_timing(honest, ref, cfg).kernel_ms == pytest.approx(0.03)
    # A big kernel whose 5 ms of work moved out of the window: speedup bounded the same way.
    big_ref = Clock(wall_ms=[505.0] * 10, reported_ms=[5.0] * 10)
    big = check_timing(Clock(wall_ms=[505.0] * 10, reported_ms=[0.01] * 10), big_ref, cfg)
    assert 5.0 / big.kernel_ms == pytest.approx(2.0, rel=1e-3)


def _h100_loop(kernel_ms: float, calls: int = 20, extra_ms: float = 0.0) -> list[float]:
    """Parent wall times per call as an H100 showed them for a tiny problem: ~1 ms of loop overhead
    (request, inputs, L2 flush, copy out, freeze, read) with 0.05-0.4 ms of noise, around the kernel."""
    return [1.0 + extra_ms + kernel_ms + 0.05 + 0.35 * ((7 * i) % calls) / calls for i in range(calls)]


def test_on_a_gpu_the_parents_clock_bounds_forged_skipped_and_skewed_reports() -> None:
    """On an H100 (bare mode) forged_timing.py got a speedup of 905, skip_timed_calls.py 90.6 and
    skewed_timing.py passed, while an honest scale kernel was flagged: the parent's estimate (least wall
    less the reference's overhead) was ~0 or noise when the loop costs ~1 ms and the kernel 5 us."""
    cfg = EvaluatorConfig()  # the GPU defaults: ratio 2, slack 0.15 ms
    ref_ms = 0.006
    ref = Clock(wall_ms=_h100_loop(ref_ms), reported_ms=[ref_ms] * 20)
    baseline = statistics.fmean(ref.reported_ms)

    def speedup(c: Clock) -> float:
        return baseline / check_timing(c, ref, cfg).kernel_ms

    # forged_timing.py: real work (its kernel about the reference's), every call reported at 0.0001 ms,
    # in a loop a little quicker than the reference's (its child, bare, had less to do around each call).
    forged = Clock(wall_ms=_h100_loop(0.008, extra_ms=-0.05), reported_ms=[0.0001] * 20)
    # skip_timed_calls.py: the work done after the window, before the answer: reported 0.001 ms.
    skipped = Clock(wall_ms=_h100_loop(0.008, extra_ms=-0.02), reported_ms=[0.001] * 20)
    # skewed_timing.py: two calls of three at 0.001 ms, the third carries the rest: an honest mean.
    skewed = Clock(wall_ms=_h100_loop(0.008), reported_ms=[0.001, 0.001, 0.022] * 6 + [0.001, 0.023])
    for name, c in (("forged", forged), ("skipped", skipped)):
        check = check_timing(c, ref, cfg)
        assert check.clamped or not check.consistent, name
        assert speedup(c) <= cfg.timing_ratio * 1.05, (name, speedup(c))  # not 905x, not 90x: at most 2x
    assert speedup(skewed) == pytest.approx(ref_ms / statistics.fmean(skewed.reported_ms))  # the mean: no gain
    assert speedup(skewed) < 1.0
    # Honest kernels in the same loop, its overhead up to 0.3 ms larger than the reference's (the audit hook,
    # the guard): never flagged; a report the clock can confirm is the figure as reported.
    for kernel, extra in ((0.006, 0.0), (0.005, 0.3), (0.012, 0.1), (0.004, 0.2)):
        honest = Clock(wall_ms=_h100_loop(kernel, extra_ms=extra), reported_ms=[kernel] * 20)
        check = check_timing(honest, ref, cfg)
        assert check.consistent, (kernel, extra, check.reason)
        if kernel >= ref_ms / 1.5:
            assert check.kernel_ms == pytest.approx(kernel), (kernel, extra)
    # Where the kernel dominates the loop the flag still resolves a forged report.
    big_ref = Clock(wall_ms=_h100_loop(5.0), reported_ms=[5.0] * 20)
    assert not check_timing(Clock(wall_ms=_h100_loop(5.0), reported_ms=[0.0001] * 20), big_ref, cfg).consistent
    assert check_timing(Clock(wall_ms=_h100_loop(2.5), reported_ms=[2.5] * 20), big_ref, cfg).kernel_ms == 2.5


def test_the_gpu_expectations_of_the_attacks_loosen_nothing() -> None:
    """Where a GPU legitimately differs (patch_launcher.py's no-op launcher really skips the kernel there;
    a tiny kernel's forged report is clamped, not flagged), the manifest's GPU expectation still never
    accepts `correct` without a flag or a clamped figure, and never touches the `all` mode."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("kforge_manifest_gpu", CANDIDATES / "manifest.py")
    m = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m  # its dataclasses look their module up there
    spec.loader.exec_module(m)  # type: ignore[union-attr]
    from kforge.evaluator.verdict import Status, Verdict

    plain = Verdict(Status.CORRECT, speedup=905.0, details={"timing_clamped": False, "clock_speedup": 1.0})
    clamped = Verdict(Status.CORRECT, speedup=1.9, details={"timing_clamped": True, "clock_speedup": 1.0})
    overridden = [a for a in m.ATTACKS if a.gpu]
    assert {a.file for a in overridden} >= {"forged_timing.py", "skip_timed_calls.py", "patch_launcher.py"}
    for a in overridden:
        assert "all" not in a.gpu and set(a.gpu) <= set(a.expect), a.file
        for mode in a.gpu:
            assert not m.matches(a.want(mode, True), plain), (a.file, mode)  # 905x, no flag: never
            assert a.want(mode, False) == a.expect[mode]
    for name in ("forged_timing.py", "skip_timed_calls.py"):
        a = next(x for x in m.ATTACKS if x.file == name)
        assert m.matches(a.want("bare", True), clamped) and not m.matches(a.want("bare", False), clamped)


def test_a_delay_in_some_calls_does_not_make_an_honest_report_inconsistent() -> None:
    """A freeze that lands late, or another process on the device, adds to some calls' wall time (seen on
    an H100: an honest CUDA ReLU flagged). The parent's estimate is its least call, which still did the
    whole work: delays never make it larger, and the figure stays the honest report."""
    cfg = EvaluatorConfig()
    ref = Clock(wall_ms=[3.0] * 9 + [30.0], reported_ms=[2.0] * 10)
    honest = Clock(wall_ms=[1.6] * 8 + [25.0, 9.0], reported_ms=[0.6] * 10)
    check = check_timing(honest, ref, cfg)
    assert check.consistent and check.kernel_ms == pytest.approx(0.6)
    assert parent_ms_per_call(honest, ref) == pytest.approx(0.6)
    # Work moved out of the window is in every call, the least one too: still caught.
    moved = Clock(wall_ms=[3.6] * 8 + [25.0, 9.0], reported_ms=[0.6] * 10)
    assert not check_timing(moved, ref, cfg).consistent


def test_cpu_allows_only_gross_disagreement() -> None:
    cfg = EvaluatorConfig()
    ref = Clock(wall_ms=[2.0] * 5, reported_ms=[1.0] * 5)  # 1 ms overhead per call
    assert _consistent(Clock([6.0] * 5, [2.0] * 5), ref, cfg, on_gpu=False)  # 5 ms seen, 2 reported
    assert not _consistent(Clock([6.0] * 5, [0.5] * 5), ref, cfg, on_gpu=True)
    assert not _consistent(Clock([15.0] * 5, [0.001] * 5), ref, cfg, on_gpu=False)  # 14 ms seen, ~0 reported


def _loop(window: list[float], after: list[float], reported: list[float]) -> Clock:
    """A clock from per-call parts: the time to the window's end and from there to the outputs read."""
    return Clock(wall_ms=[w + a for w, a in zip(window, after)], reported_ms=reported, window_ms=window)


def test_a_loaded_machine_flags_an_honest_kernel_against_a_quiet_reference_but_not_against_its_twin() -> None:
    """The reference's clock is measured once, maybe on a quiet machine; the candidate is timed under load
    (CI on a busy 2-core machine: "13.97 ms per call from the window's end to the outputs read, the
    reference 0.8136 ms"). The first check flags it; paired with a twin timed call by call in the same
    moment, the same load is on both sides and nothing is flagged."""
    quiet_ref = _loop([2.0] * 5, [0.8] * 5, [1.0] * 5)
    loaded = _loop([9.0, 12.0, 8.0, 15.0, 10.0], [14.0, 20.0, 16.0, 30.0, 18.0], [1.1] * 5)
    assert not check_timing(loaded, quiet_ref, EvaluatorConfig(), on_gpu=False).consistent
    twin = _loop([8.0, 13.0, 7.5, 16.0, 9.0], [13.0, 22.0, 15.0, 28.0, 17.0], [1.0] * 5)
    check = recheck_timing(loaded, twin, EvaluatorConfig(), on_gpu=False)
    assert check.consistent and check.kernel_ms == pytest.approx(1.1)


def test_paired_calls_still_catch_work_after_the_window_and_forged_reports_under_load() -> None:
    cfg = EvaluatorConfig()
    twin = _loop([8.0, 13.0, 7.5, 16.0, 9.0], [13.0, 22.0, 15.0, 28.0, 17.0], [1.0] * 5)
    # The outputs computed during the copy-out: 40 ms of interpreter work after every window.
    deferred = _loop([7.0, 12.0, 7.0, 15.0, 8.0], [53.0, 60.0, 57.0, 70.0, 55.0], [0.001] * 5)
    check = recheck_timing(deferred, twin, cfg, on_gpu=False)
    assert not check.consistent and "work after the window" in check.reason
    # A report forged low: its windows hold 40 ms of work more than the twin's set-up.
    forged = _loop([48.0, 53.0, 47.5, 56.0, 49.0], [13.0, 22.0, 15.0, 28.0, 17.0], [0.001] * 5)
    assert not recheck_timing(forged, twin, cfg, on_gpu=False).consistent
    # On a GPU the same rules with the GPU's slack (0.15 ms + half the twin's ~1 ms set-up): 1 ms more after
    # every window is flagged there, 0.05 ms is noise.
    gpu_twin = _loop([1.0] * 16, [0.4] * 16, [0.01] * 16)
    gpu_deferred = _loop([1.0] * 16, [1.4] * 16, [0.01] * 16)
    assert recheck_timing(_loop([1.0] * 16, [0.45] * 16, [0.01] * 16), gpu_twin, cfg).consistent
    assert not recheck_timing(gpu_deferred, gpu_twin, cfg).consistent


def test_one_delayed_pair_moves_no_median_and_a_short_clock_is_no_report() -> None:
    cfg = EvaluatorConfig()
    twin = _loop([1.0] * 16, [0.4] * 16, [0.01] * 16)
    burst = _loop([1.0] * 15 + [40.0], [0.4] * 15 + [60.0], [0.01] * 16)
    assert recheck_timing(burst, twin, cfg).consistent
    short = Clock(wall_ms=[1.4] * 15, reported_ms=[0.01] * 15, window_ms=[1.0] * 15)
    check = recheck_timing(short, twin, cfg)
    assert not check.consistent and check.kernel_ms is None


def test_the_timed_order_puts_half_the_checked_calls_where_no_budget_cuts() -> None:
    import random

    from kforge.evaluator.reference import timed_order

    checked = [i % 6 == 0 for i in range(100)]  # 17 of 100 compared
    for seed in range(20):
        order = timed_order(checked, 20, random.Random(seed))
        assert sorted(order) == list(range(100))
        assert sum(checked[i] for i in order[:20]) == 9  # half of 17, rounded up
    assert sorted(timed_order([True] * 8, 20, random.Random(0))) == list(range(8))  # fewer calls than the head
    orders = {tuple(timed_order(checked, 20, random.Random(s))[:20]) for s in range(5)}
    assert len(orders) == 5  # no fixed pattern a child could learn


def test_a_time_budget_stops_the_timed_calls_after_the_least_count() -> None:
    import time as _time

    from kforge.evaluator import drive

    class Slow:  # a child whose every call takes 10 ms
        arena = None

        def ask(self, request, expect, deadline, max_bytes):
            if expect == P.WINDOW:
                _time.sleep(0.01)
            return {"type": expect, "ms": 9.0}

        def read(self, meta, slots, where, plain=None):
            return []

    seeds, where = list(range(100)), [[None]] * 100
    clock, got = drive.timed_calls(Slow(), seeds, [None], [None], where, _time.monotonic() + 60, budget=(0.1, 5))
    assert 5 <= len(got) == len(clock.wall_ms) < 30
    clock, got = drive.timed_calls(Slow(), seeds[:8], [None], [None], where[:8], _time.monotonic() + 60, budget=(0.0, 5))
    assert len(got) == 5  # the least count is made even with no time left
    assert len(drive.timed_calls(Slow(), seeds[:8], [None], [None], where[:8], _time.monotonic() + 60)[1]) == 8


# --- samples of timed calls and large outputs ----------------------------------------------------

def test_samples_of_every_timed_call_must_match() -> None:
    cfg = EvaluatorConfig()
    want = [[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 4.0])]]
    assert check_samples([[torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 4.0])]], want, cfg) == ""
    stale = check_samples([[torch.tensor([1.0, 2.0])], [torch.tensor([1.0, 2.0])]], want, cfg)
    assert stale.startswith("timed call 2")
    assert "answered for 1" in check_samples([[torch.tensor([1.0, 2.0])]], want, cfg)


def test_positions_cover_both_ends_of_a_large_output_and_are_seeded() -> None:
    meta = [[[3, 5000], "torch.float32"], None]
    pos = compare_positions(meta, 100, torch.Generator().manual_seed(1))
    assert pos[1] is None and pos[0].numel() == 2 * EDGE + 100
    assert int(pos[0].min()) == 0 and int(pos[0].max()) == 14999 and 14999 in pos[0].tolist()
    again = compare_positions(meta, 100, torch.Generator().manual_seed(1))
    assert torch.equal(pos[0], again[0])
    small = sample_positions([[[4], "torch.float32"]], 64, torch.Generator().manual_seed(0))
    assert small[0].numel() == 4 and int(small[0].max()) < 4
    assert meta_bytes(meta) == 3 * 5000 * 4


def test_meta_is_checked_before_any_value_is_accepted() -> None:
    want = [[[48, 40], "torch.float32"]]
    assert meta_mismatch([[[48, 40], "torch.float32"]], want) == ""
    assert "shape (1920,)" in meta_mismatch([[[1920], "torch.float32"]], want)
    assert "torch.float16" in meta_mismatch([[[48, 40], "torch.float16"]], want)
    assert "returned 2 outputs" in meta_mismatch([None, None], want)
    assert "expected 1" in meta_mismatch("junk", want)


# --- trials and evidence -----------------------------------------------------------------------

def test_judge_trials_counts_failures_and_flags_constant_outputs() -> None:
    cfg = EvaluatorConfig()
    a, b = torch.rand(4), torch.rand(4)
    trials = [(1, False), (2, False), (3, True)]
    expected = [[a], [b], [-a]]
    ev = [{"kernels": 1, "kernels_on_data": 1}] * 3
    f = judge_trials(trials, [[a], [b], [a]], expected, ev, cfg)
    assert (f.passed, f.total) == (2, 3) and f.reasons[0].startswith("signed-input trial")
    f = judge_trials(trials, [[a], [a], "shape (2,) != expected (4,)"], expected, ev, cfg)
    assert f.passed == 1 and "identical_outputs_across_trials" in f.flags
    assert "shape (2,)" in f.reasons[-1]


def test_evidence_adds_flags_and_ignores_non_trial_reports() -> None:
    assert flags_from_evidence([{"kernels": 0}]) == ["no_kernel_launched"]
    assert flags_from_evidence([{"kernels": 2, "kernels_on_data": 0}]) == ["kernel_not_on_trial_data"]
    assert flags_from_evidence([{"denied": ["open"], "patched": ["patched:time.time"]}]) == \
        ["patched:time.time", "sandbox_denied:open"]
    assert flags_from_evidence([{"kernels": 1, "kernels_on_data": 1, "aliases_input": True}]) == ["output_aliases_input"]


def test_coverage_is_the_share_of_kernel_time_in_the_candidates_kernels() -> None:
    times = {"relu_kernel": 30.0, "ampere_sgemm_128x64": 70.0}
    assert kernel_coverage(times, {"relu_kernel"}) == pytest.approx(0.3)
    assert kernel_coverage(times, set()) == 0.0
    assert kernel_coverage({}, {"relu_kernel"}) == 0.0  # launched nothing at all: none of the work, not "unknown"


def test_coverage_names_match_exactly() -> None:
    torch_kernel = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::foo>(int, float)"
    times = {torch_kernel: 90.0, "v": 10.0}
    assert qualified_name(torch_kernel) == "at::native::vectorized_elementwise_kernel"
    # A kernel named `v`, or named like PyTorch's, claims nothing of PyTorch's kernels.
    assert kernel_coverage(times, {"v"}) == pytest.approx(0.1)
    assert kernel_coverage(times, {"vectorized_elementwise_kernel"}) == 0.0
    # A namespace the candidate's source opened counts; PyTorch's do not, even when its source names them.
    assert is_own("mine::k(float*)", {"k"}, {"mine"}) and not is_own("at::native::k(float*)", {"k"}, {"mine"})


def test_a_cuda_kernel_of_load_inline_counts_as_the_candidates() -> None:
    source = CUDA_RELU.split("cuda_src = r'''")[1].split("'''")[0]
    names, spaces = cuda_kernel_names(source)
    assert names == {"relu_kernel"}
    profiled = {"relu_kernel(float const*, float*, long)": 40.0,
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >(int, float)": 10.0}
    assert kernel_coverage(profiled, names, spaces) == pytest.approx(0.8)
    odd = "namespace k2 {\n__global__ void __launch_bounds__(256) add_kernel(const float* a) {}\n}\n" \
          "template <typename T> __global__ void tk(T* x) {}\n// __global__ void commented(float* x)\n"
    assert cuda_kernel_names(odd) == ({"add_kernel", "tk"}, {"k2"})


def test_an_honest_cuda_kernel_in_a_nameless_namespace_is_its_own() -> None:
    """Profiler-shaped names (torch.profiler's key_averages keys) of ordinary load_inline kernels: one in
    `namespace { ... }` (once coverage 0.0: the `(` of `(anonymous namespace)` ended the name), a template,
    launch bounds. PyTorch's kernels of the same leaf name in its own nameless namespaces stay PyTorch's."""
    source = ("#include <torch/extension.h>\nnamespace {\n__global__ void __launch_bounds__(256) relu_kernel("
              "const float* x, float* y, int n) {}\n}\ntemplate <typename T>\n__global__ void scale_kernel(T* y, T a, "
              "int n) {}\n")
    names, spaces = cuda_kernel_names(source)
    assert names == {"relu_kernel", "scale_kernel"}
    profiled = {"(anonymous namespace)::relu_kernel(float const*, float*, int)": 50.0,
                "void scale_kernel<float>(float*, float, int)": 30.0,
                "void at::native::(anonymous namespace)::relu_kernel<float>(float*)": 5.0,
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)": 15.0}
    assert kernel_coverage(profiled, names, spaces) == pytest.approx(0.8)
    # A source that opens no nameless namespace claims no kernel in one.
    assert kernel_coverage(profiled, names, set()) == pytest.approx(0.3)


def test_a_correct_flagged_candidate_still_gets_coverage_and_none_of_its_kernels_is_zero() -> None:
    """decoy.py, prefix_name.py (flagged kernel_not_needed) and lazy.py (flagged timing_inconsistent) got
    coverage None on an H100: coverage was measured only after a consistent, unflagged timing."""
    from types import SimpleNamespace

    from kforge.evaluator.child.coverage import kernel_times
    from kforge.evaluator.timing_stage import wants_profile
    from kforge.evaluator.verdict import Status, Verdict

    for flags in ([], ["kernel_not_needed"], ["timing_inconsistent"], ["timed_output_mismatch"]):
        assert wants_profile(Verdict(Status.CORRECT, flags=list(flags), timing_meaningful=True)), flags
    assert not wants_profile(Verdict(Status.CORRECT, flags=["failed_when_timed"], timing_meaningful=True))
    assert not wants_profile(Verdict(Status.CORRECT, timing_meaningful=False))  # the Triton interpreter
    assert not wants_profile(Verdict(Status.INCORRECT, timing_meaningful=True))
    # evaluator.coverage off (the default: a profiler start-up costs seconds per child): only a candidate
    # whose outputs PyTorch finished is profiled, since the judge's own rule needs its share.
    correct = Verdict(Status.CORRECT, timing_meaningful=True)
    assert not wants_profile(correct, every=False) and wants_profile(correct, every=False, finished=True)

    def ev(key: str, device_us: float, cuda_us: float = 0.0) -> SimpleNamespace:
        return SimpleNamespace(key=key, device_time_total=device_us, cuda_time_total=cuda_us)

    # decoy.py's profiled call, as key_averages() gives it: PyTorch's GEMM and clamp do the work.
    events = [ev("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", 410.0),
              ev("void at::native::vectorized_elementwise_kernel<4, at::native::clamp_min>(int)", 12.0),
              ev("touch_kernel", 1.5), ev("Memset (Device)", 0.0), ev("", 3.0), ev("old_torch_kernel", 0.0, 2.0)]
    times = kernel_times(events)
    assert set(times) == {events[0].key, events[1].key, "touch_kernel", "old_torch_kernel"}
    assert 0.0 < kernel_coverage(times, {"touch_kernel"}) < 0.01
    assert kernel_coverage(times, {"relu_kernel"}) == 0.0  # its kernel never ran: 0, not None
    assert kernel_coverage(kernel_times([]), {"relu_kernel"}) == 0.0


# --- the wire: bounded, pickle-free frames -------------------------------------------------------

def test_frames_larger_than_expected_are_refused_before_reading() -> None:
    r, w = os.pipe()
    try:
        os.write(w, struct.pack("<Q", 1 << 40))
        reader = FrameReader(r)
        with pytest.raises(WireError):
            reader.read(None, max_bytes=1 << 20)
        send_frame(w, encode({"type": "x"}))
    finally:
        os.close(w)


@pytest.mark.parametrize("payload", [b"", b"\x05\x00\x00\x00{bad", struct.pack("<I", 2) + b"{}"])
def test_malformed_messages_raise_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode(payload)


def test_tensor_table_cannot_point_outside_the_frame() -> None:
    good = encode({"t": torch.ones(4)})
    with pytest.raises(WireError):
        decode(good[:-4])  # the bytes the table promises are not there


# --- static bans: what no kernel needs, while ordinary kernels pass ------------------------------

@pytest.mark.parametrize("snippet", [
    "import sys", "import os", "from inspect import currentframe", "import importlib", "import ctypes",
    "import gc", "from kforge.evaluator.child import harness", "import torch._C", "from torch import multiprocessing",
    "x = torch.sys", "f = open('x')", "exec('1')", "eval('1')", "compile('1', 'f', 'exec')", "g = globals()",
    "v = vars(torch)", "a = getattr(torch, 'cu' + 'da')", "setattr(torch.cuda, 'synchronize', None)",
    "torch.cuda.synchronize = None", "triton.runtime.jit.JITFunction.run = None", "c = torch.__dict__",
    "s = ().__class__.__base__.__subclasses__()", "f = __import__('os')", "from triton import *",
])
def test_banned_constructs_are_rejected_with_a_line(snippet: str) -> None:
    rep = check_source(GOOD + "\n" + snippet + "\n", RELU, "triton")
    assert rep.errors and "not allowed in a kernel" in rep.errors[0], (snippet, rep.errors)
    assert "(line " in rep.errors[0]


def test_ordinary_kernels_pass_the_static_checks() -> None:
    # (an unused load_inline import was here: a Triton candidate may no longer build native code at all)
    style = GOOD.replace("import triton.language as tl", "import triton.language as tl\nimport math\n"
                         "from typing import Optional")
    style += '''

@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def other_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass


def helper(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x).view(-1)
    return out.reshape(x.shape)
'''
    assert check_source(style, RELU, "triton").errors == []
    for path in sorted((REPO / "kforge/problems/builtin").glob("level*/solutions/*.py")):
        assert check_source(path.read_text(), RELU, "triton").errors == [], path.name


def test_a_decorator_named_jit_is_not_a_triton_kernel() -> None:
    fake = "import torch\nimport torch.nn as nn\n\ndef jit(f):\n    return f\n\n@jit\ndef k(x):\n    return x\n\n" \
           "class ModelNew(nn.Module):\n    def forward(self, x):\n        return k(x)\n"
    assert any("triton.jit" in e for e in check_source(fake, RELU, "triton").errors)
    real = fake.replace("def jit(f):\n    return f\n", "from triton import jit\n")
    assert not any("triton.jit" in e for e in check_source(real, RELU, "triton").errors)


def test_the_candidate_child_gets_no_model_class() -> None:
    text = P.inputs_only(RELU)
    assert "class Model" not in text and "def get_inputs" in text and "def get_init_inputs" in text
    ns: dict = {}
    exec(compile(text, "inputs", "exec"), ns)  # noqa: S102 - the test's own text
    assert ns["get_inputs"]()[0].shape == (48, 40)


# --- the PyTorch-op flag resolves names through the imports -------------------------------------

GELU_REF = (CANDIDATES / "manifest.py").read_text().split("TANH_GELU = '''")[1].split("'''")[0]
ORDINARY = (CANDIDATES / "ordinary_gelu.py").read_text()


def test_math_constants_in_launch_arguments_are_not_the_pytorch_op() -> None:
    # The reference calls math.sqrt and torch.tanh; the kernel's launch computes math.sqrt(2 / pi).
    rep = check_source(ORDINARY, GELU_REF, "triton")
    assert rep.errors == [] and rep.flags == []
    autotuned = (CANDIDATES / "ordinary_autotune.py").read_text()
    assert check_source(autotuned, GELU_REF, "triton").flags == []


@pytest.mark.parametrize("imports, use", [
    ("from torch.nn.functional import relu as act", "act(x)"),
    ("from torch import relu", "relu(x)"),
    ("import torch.nn.functional as F", "F.relu(x)"),
    ("import torch.nn.functional as nnf", "list(map(nnf.relu, [x]))[0]"),  # referenced, not called
    ("", "x.relu()"),
])
def test_the_reference_op_is_flagged_under_any_local_name(imports: str, use: str) -> None:
    code = GOOD.replace("import torch.nn as nn", f"import torch.nn as nn\n{imports}").replace(
        "        return relu(x)", f"        return {use}")
    assert f"return {use}" in code
    assert "pytorch_op:relu" in check_source(code, RELU, "triton").flags, (imports, use)


@pytest.mark.parametrize("snippet", [
    "y = torch.ops.aten.relu.default(torch.ones(1))", "lib = torch.library.Library('aten', 'IMPL')",
    "from torch.overrides import TorchFunctionMode", "import numpy as np\na = np.load('x.npy', allow_pickle=True)",
    "import numpy\nnumpy.save('x.npy', numpy.zeros(1))", "s = torch.load('x.pt', weights_only=False)",
    "from numpy import load", "import numpy as np\nnp.zeros(1).tofile('x')",
    "M = type('M', (object,), {})", "d = {'__torch_function__': None}",
])
def test_interception_and_loaders_are_banned_by_any_path(snippet: str) -> None:
    rep = check_source(GOOD + "\n" + snippet + "\n", RELU, "triton")
    assert rep.errors and "not allowed in a kernel" in rep.errors[0], (snippet, rep.errors)


NATIVE_BUILDS = [
    "from triton.runtime.build import compile_module_from_src", "import triton.runtime.build as b",
    "from triton.runtime import build", "m = triton.runtime.build.compile_module_from_src('int x;', 'm')",
    "from triton.backends.nvidia.driver import compile_module_from_src", "triton.knobs.build.impl = print",
    "from triton.tools.compile import compile_kernel", "from torch.utils.cpp_extension import load",
    "import torch.utils.cpp_extension as ext\nm = ext.load('m', ['m.cpp'])",
    "from torch.utils.benchmark import Timer", "import numpy as np\nb = np.testing.extbuild",
    "from numpy import f2py",
]


@pytest.mark.parametrize("snippet", NATIVE_BUILDS)
def test_native_builds_fail_the_static_check(snippet: str) -> None:
    """Compiling and loading native code at import (Triton's own builder, torch's and numpy's) ran before the
    lock-down and left a thread that never met the interpreter again (native_build_thread.py): banned by any
    path for every backend; a CUDA candidate keeps load_inline, which the harness sends to its build child."""
    assert "not allowed in a kernel" in " ".join(check_source(GOOD + "\n" + snippet + "\n", RELU, "triton").errors)
    cuda = CUDA_RELU.replace("class ModelNew", "import triton\n" + snippet + "\n\n\nclass ModelNew", 1)
    assert "not allowed in a kernel" in " ".join(check_source(cuda, RELU, "cuda").errors), snippet


def test_load_inline_passes_the_static_check_for_cuda_only() -> None:
    assert check_source(CUDA_RELU, RELU, "cuda").errors == []
    spelled = CUDA_RELU.replace("from torch.utils.cpp_extension import load_inline", "import torch.utils.cpp_extension")
    spelled = spelled.replace("ext = load_inline(", "ext = torch.utils.cpp_extension.load_inline(")
    assert spelled != CUDA_RELU and check_source(spelled, RELU, "cuda").errors == []
    with_triton = GOOD + "\nfrom torch.utils.cpp_extension import load_inline\n"
    assert "not allowed in a kernel" in " ".join(check_source(with_triton, RELU, "triton").errors)


@pytest.mark.parametrize("snippet", [
    "import operator\ncells = operator.attrgetter('__closure__')(triton.runtime.jit.JITFunction.run)",
    "from operator import attrgetter", "import operator\nf = operator.methodcaller('x')",
    "import functools\nf = functools.reduce(getattr, ['run'], triton.runtime.jit.JITFunction)", "g = getattr",
    "text = '{0.__globals__}'.format(relu)", "c = relu.cell_contents",
    # no `.name` and no text: a class pattern's keywords, and update_wrapper copying names chosen at run time
    "match relu:\n    case object(__closure__=cells):\n        pass",
    "match relu:\n    case object(cell_contents=guard):\n        pass",
    "import functools\nfrom dataclasses import dataclass, fields\n\n\n@dataclass\nclass H:\n"
    "    __closure__: object = None\n\n\nh = H()\nfunctools.update_wrapper(h, relu, (fields(H)[0].name,), ())\n"
    "match h:\n    case H(cells):\n        pass",
    "from functools import wraps\nw = wraps(relu, assigned=[n for n in ('a',)])",
])
def test_dunder_lookups_written_as_text_are_banned(snippet: str) -> None:
    """closure_guard.py read the launch recorder's Guard through `operator.attrgetter('__closure__')`
    with no banned name in its source (then forged its launches and read the decoy switch)."""
    rep = check_source(GOOD + "\n" + snippet + "\n", RELU, "triton")
    assert rep.errors and "not allowed in a kernel" in rep.errors[0], (snippet, rep.errors)


def test_text_that_names_no_hidden_attribute_is_fine() -> None:
    code = GOOD.replace("import torch\n", 'import torch\n"""Docstrings may say __init__ or __len__."""\n', 1)
    code += "\nif __name__ == '__main__':\n    print(hasattr(ModelNew, 'forward'))\n"
    code += "\nimport functools\n\n\ndef logged(f):\n    @functools.wraps(f)\n    def inner(*a):\n" \
            "        return f(*a)\n    return inner\n\n\nmatch 3:\n    case int(real=r):\n        pass\n"
    assert check_source(code, RELU, "triton").errors == []


ORDINARY_CUDA = """import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

HEADER = "#include <torch/extension.h>\\n#include <cuda_runtime.h>\\n"
BODY = r'''
__device__ __forceinline__ float act(float v) { return v > 0.f ? v : 0.f * __expf(v); }

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    __shared__ float tile[256];
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.f;
    __syncthreads();
    if (i < n) y[i] = act(tile[threadIdx.x]);
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
'''
cuda_src = HEADER + BODY.replace("__FLT_SUFFIX__", "f")
cuda_src += "\\n// __launch_bounds__ left to the compiler\\n"


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="relu_ext", cpp_sources=["torch::Tensor relu_cuda(torch::Tensor x);"],
                               cuda_sources=[cuda_src], functions=["relu_cuda"],
                               extra_cuda_cflags=["-O3", "-D__CUDA_NO_HALF_OPERATORS__"], verbose=False)

    def forward(self, x):
        return self.ext.relu_cuda(x.contiguous())
"""


def test_cuda_sources_full_of_dunder_names_pass_the_static_check() -> None:
    """C/CUDA text is `__global__`, `__restrict__`, `__syncthreads`, `__expf`: the ban on dunder names in
    text failed every honest CUDA candidate on the GPU (`static_check_failed`)."""
    from bench.repeatability import kernels

    sources = {p.name: p.read_text() for p in sorted(CANDIDATES.glob("cuda_*.py"))}
    sources.update({f"repeatability {pid}": code for pid, backend, code in kernels() if backend == "cuda"})
    sources["ordinary"] = ORDINARY_CUDA
    assert len(sources) >= 6
    for name, code in sources.items():
        assert check_source(code, RELU, "cuda").errors == [], name


@pytest.mark.parametrize("edit", [
    # the same text handed to load_inline and to a lookup
    ("cpp_src = ", "leak = cuda_src[:9].format(relu)\ncpp_src = "),
    ("cpp_src = ", "keep = [cuda_src]\ncpp_src = "),
    # a home-made load_inline, or a rebound name, receives the text
    ("from torch.utils.cpp_extension import load_inline",
     "def load_inline(**kw):\n    return kw['cpp_sources'].format(relu)"),
    ("ext = load_inline(", "load_inline = print\next = load_inline("),
    # text built by something other than text operations, or kept where no name is read
    ("cpp_sources=cpp_src", "cpp_sources=(leak := '{0.__closure__}')"),
    ("cpp_sources=cpp_src", "cpp_sources=str('{0.__globals__}'.format(relu))"),
    ("class ModelNew", "class Holder:\n    text = '__closure__'\n\n\nclass ModelNew"),
    ("class ModelNew", "class Holder:\n    __match_args__ = ('__closure__',)\n\n\nclass ModelNew"),
    ("class ModelNew", "import functools\nfunctools.update_wrapper(relu, relu, assigned=('__closure__',))\n\n\n"
                       "class ModelNew"),
    ("cpp_src = ", "for cuda_src in ['{0.__globals__}']:\n    pass\ncpp_src = "),
])
def test_text_lookups_beside_cuda_source_are_still_banned(edit: tuple[str, str]) -> None:
    old, new = edit
    code = CUDA_RELU.replace(old, new, 1).replace("class ModelNew", "relu = None\n\n\nclass ModelNew", 1)
    assert code != CUDA_RELU
    rep = check_source(code, RELU, "cuda")
    assert any("as text" in e or "computed name" in e for e in rep.errors), (edit, rep.errors)


def test_builtin_solutions_against_their_own_problems_carry_no_flag() -> None:
    from kforge.problems import builtin_problems

    for p in builtin_problems():
        rep = check_source(p.solution, p.code, "triton")
        assert rep.errors == [] and rep.flags == [], (p.key, rep.errors, rep.flags)


# --- the audit hook: code made or unpickled with the candidate on the stack ----------------------

def test_code_made_at_run_time_counts_as_the_candidates() -> None:
    from kforge.evaluator.child.guard import candidate_like

    cand = "/scratch/candidate.py"
    assert candidate_like(cand, cand) and candidate_like("<string>", cand) and candidate_like("<timeit-src>", cand)
    assert not candidate_like("<frozen importlib._bootstrap>", cand)
    assert not candidate_like("/usr/lib/python3.11/dataclasses.py", cand)


def test_who_may_make_code_with_a_candidate_frame_on_the_stack() -> None:
    from kforge.evaluator.child.guard import may_make_code

    stdlib = ("/py/lib/python3.11/",)
    libs = stdlib + ("/venv/site-packages/",)
    triton_dir = "/venv/site-packages/triton/"

    def may(event: str, args: tuple, caller: str) -> bool:
        return may_make_code(event, args, caller, libs, triton_dir, stdlib)

    code = compile("x = 1", "/venv/site-packages/pkg/mod.py", "exec")
    assert may("exec", (code,), "<frozen importlib._bootstrap>")  # importing an installed module
    assert may("compile", (b"x", "/venv/site-packages/pkg/mod.py"), "<frozen importlib._bootstrap_external>")
    assert may("marshal.loads", (b"",), "<frozen importlib._bootstrap_external>")
    assert not may("exec", (compile("x = 1", "/scratch/evil.py", "exec"),), "<frozen importlib._bootstrap>")
    assert may("exec", (code,), "/venv/site-packages/triton/runtime/jit.py")  # Triton's binder
    assert may("compile", ("def f(): pass", "<string>"), "/py/lib/python3.11/dataclasses.py")
    # numpy.load / torch.load unpickling, timeit running a statement, torch.fx making code: refused.
    assert not may("pickle.find_class", ("builtins", "exec"), "/venv/site-packages/numpy/lib/format.py")
    assert not may("exec", (code,), "/venv/site-packages/numpy/lib/format.py")
    assert not may("compile", ("import os", "<timeit-src>"), "/py/lib/python3.11/timeit.py")
    assert not may("exec", (code,), "/venv/site-packages/torch/fx/graph_module.py")
    # Triton compiling a kernel on a GPU makes a namedtuple per signature: the standard library raises the
    # event, Triton asks. The same from a library that is not Triton is refused.
    collections = "/py/lib/python3.11/collections/__init__.py"
    namedtuple_new = ("lambda _cls, a: _tuple_new(_cls, (a,))", "<string>")
    assert may_make_code("compile", namedtuple_new, collections, libs, triton_dir, stdlib,
                         asker="/venv/site-packages/triton/compiler/code_generator.py")
    assert not may_make_code("compile", namedtuple_new, collections, libs, triton_dir, stdlib,
                             asker="/venv/site-packages/numpy/lib/format.py")
    assert not may("compile", namedtuple_new, collections)


def test_tritons_generated_binder_is_not_the_candidate_but_other_run_time_code_is():
    """On a GPU, Triton's first launch runs its argument binder (a `<string>` function Triton generates)
    whose native specialisation opens files: that is Triton asking, not the candidate. Code made at run
    time and called from anywhere else still counts as the candidate's."""
    import os
    import sys

    import triton

    from kforge.evaluator.child.guard import _stdlib_dirs, asker_is_candidate

    triton_dir = os.path.join(os.path.dirname(os.path.abspath(triton.__file__)), "")
    made: dict = {}
    exec("def dynamic_func():\n    return sys._getframe(0)\n", {"sys": sys}, made)  # filename <string>
    launcher: dict = {}
    exec(compile("def run(f):\n    return f()\n", triton_dir + "runtime/jit.py", "exec"), launcher)
    stdlib, cand = _stdlib_dirs(), "/scratch/kforge_candidate.py"
    assert not asker_is_candidate(launcher["run"](made["dynamic_func"]), cand, stdlib, triton_dir)
    assert asker_is_candidate(made["dynamic_func"](), cand, stdlib, triton_dir)  # called from here instead
    assert asker_is_candidate(made["dynamic_func"](), cand, stdlib, "")  # no Triton: no exception
    # A generated function of another name (a dataclass's __init__ given to Triton as a hook) is not it.
    other: dict = {}
    exec("def __init__():\n    return sys._getframe(0)\n", {"sys": sys}, other)
    assert asker_is_candidate(launcher["run"](other["__init__"]), cand, stdlib, triton_dir)


def test_work_after_the_window_is_caught_and_the_slack_does_not_grow_with_the_copy_out() -> None:
    """A big output: ~50 ms of copy-out around a 1 ms kernel. The flag's slack was half the reference's whole
    overhead (copy-out included, ~25 ms): work moved after the window hid in it. The child now marks its
    window's end; the slack comes from the set-up before it, and the time after it is compared apart."""
    cfg = EvaluatorConfig()
    ref = Clock(wall_ms=[51.5] * 10, reported_ms=[1.0] * 10, window_ms=[1.5] * 10)
    honest = Clock(wall_ms=[51.8] * 10, reported_ms=[1.0] * 10, window_ms=[1.6] * 10)
    assert check_timing(honest, ref, cfg).consistent
    moved = Clock(wall_ms=[52.5] * 10, reported_ms=[0.01] * 10, window_ms=[0.6] * 10)  # 1 ms after the window
    unmarked = check_timing(Clock(moved.wall_ms, moved.reported_ms), Clock(ref.wall_ms, ref.reported_ms), cfg)
    assert unmarked.consistent  # without the mark: lost in the copy-out's share of the slack
    check = check_timing(moved, ref, cfg)
    assert not check.consistent and "after the window" in check.reason
    before = Clock(wall_ms=[52.5] * 10, reported_ms=[0.01] * 10, window_ms=[2.5] * 10)  # 1 ms before the window
    assert not check_timing(before, ref, cfg).consistent


class _ScriptedChild:
    """A child that answers every timed call: WINDOW, then TIMED; it records the requests."""

    arena = None

    def __init__(self) -> None:
        self.requests: list[dict] = []

    def ask(self, request, expect, deadline, max_bytes):
        if request is not None:
            self.requests.append(request)
        return {"type": expect, "ms": 1.0, "plain": [], "evidence": {"kernels": 1, "kernels_on_data": 1},
                "coverage": 0.5 if request is None and self.requests[-1]["profile"] else None}

    def read(self, meta, slots, where, plain):
        return [len(self.requests)]


def test_the_profiled_call_is_a_timed_call_whose_outputs_are_read_and_whose_time_is_left_out() -> None:
    from kforge.evaluator import drive

    child, answers = _ScriptedChild(), []
    clock, samples = drive.timed_calls(child, [11, 12, 13, 14], [None], [None], [None] * 4, 1e12, 2, answers)
    assert [r["profile"] for r in child.requests] == [False, False, True, False]
    assert samples == [[1], [2], [3], [4]]  # the profiled call's outputs are read like the others
    assert len(clock.wall_ms) == len(clock.window_ms) == len(clock.reported_ms) == 3
    assert answers[2]["coverage"] == 0.5 and timed_evidence_flags(answers) == []
    assert timed_evidence_flags(answers + [{"evidence": {"kernels": 0, "kernels_on_data": 0}}]) != []
    assert timed_evidence_flags([{}]) == ["timed_call_without_kernel"]  # no evidence shows no kernel
