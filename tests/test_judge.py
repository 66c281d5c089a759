"""The judge's pure parts: parent-side rules, the wire, the static bans, the protocol's problem text."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import torch

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import protocol as P
from kforge.evaluator.harness import kernel_coverage
from kforge.evaluator.judge import (EDGE, Clock, check_samples, compare_positions, flags_from_evidence, judge_trials,
                                    meta_bytes, meta_mismatch, parent_ms_per_call, sample_positions,
                                    timing_consistent)
from kforge.evaluator.static_check import check_source
from kforge.evaluator.wire import FrameReader, WireError, decode, encode, send_frame

ROOT = Path(__file__).resolve().parents[1]
RELU = (ROOT / "tests/candidates/manifest.py").read_text().split("RELU = '''")[1].split("'''")[0]
GOOD = (ROOT / "tests/candidates/relu_correct.py").read_text()


# --- timing: the parent's clock against the child's report -------------------------------------

def test_parent_estimate_subtracts_the_harness_overhead_measured_on_the_reference() -> None:
    ref = Clock(wall_s=0.030, reported_ms=[2.0] * 10)  # 3 ms per call seen, 2 ms reported: 1 ms overhead
    cand = Clock(wall_s=0.016, reported_ms=[0.6] * 10)  # 1.6 ms per call seen
    assert parent_ms_per_call(cand, ref) == pytest.approx(0.6)
    assert timing_consistent(cand, ref, EvaluatorConfig())


def test_forged_or_skipped_timings_are_inconsistent() -> None:
    cfg = EvaluatorConfig(timing_ratio=1.5, timing_slack_ms=0.02)
    ref = Clock(wall_s=0.030, reported_ms=[2.0] * 10)
    forged = Clock(wall_s=0.016, reported_ms=[0.0001] * 10)  # did 0.6 ms of work per call, claims 0.0001
    assert not timing_consistent(forged, ref, cfg)
    # Just inside the allowance: 0.6 <= 1.5 * 0.39 + 0.02.
    assert timing_consistent(Clock(0.016, [0.39] * 10), ref, cfg)
    assert not timing_consistent(Clock(0.016, [0.38] * 10), ref, cfg)
    assert not timing_consistent(Clock(0.016, []), ref, cfg)  # no report at all


def test_cpu_allows_only_gross_disagreement() -> None:
    cfg = EvaluatorConfig()
    ref = Clock(wall_s=0.010, reported_ms=[1.0] * 5)  # 1 ms overhead per call
    assert timing_consistent(Clock(0.030, [2.0] * 5), ref, cfg, on_gpu=False)  # 5 ms seen, 2 reported
    assert not timing_consistent(Clock(0.030, [0.5] * 5), ref, cfg, on_gpu=True)
    assert not timing_consistent(Clock(0.075, [0.001] * 5), ref, cfg, on_gpu=False)  # 14 ms seen, ~0 reported


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
    times = {"relu_kernel_0d1d": 30.0, "ampere_sgemm_128x64": 70.0}
    assert kernel_coverage(times, {"relu_kernel"}) == pytest.approx(0.3)
    assert kernel_coverage(times, set()) == 0.0
    assert kernel_coverage({}, {"relu_kernel"}) is None


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
    "import gc", "from kforge.evaluator import harness", "import torch._C", "from torch import multiprocessing",
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
    style = GOOD.replace("import triton.language as tl", "import triton.language as tl\nimport math\n"
                         "from typing import Optional\nfrom torch.utils.cpp_extension import load_inline  # noqa")
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
    for path in sorted((ROOT / "kforge/problems/builtin").glob("level*/solutions/*.py")):
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
