"""Every built-in problem runs, and its reference Triton solution matches it under the Triton interpreter.

All problems are checked in ONE fresh process (TRITON_INTERPRET=1 must be set before Triton is imported,
and a bad kernel can take the interpreter down with it). Deliberately wrong solutions ride along in the
same process to show the check can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kforge.problems import builtin_problems, find_problem

CHILD = r"""
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
from dataclasses import asdict, replace
from kforge.problems import builtin_problems, find_problem
from kforge.problems.selfcheck import check_solutions

problems = builtin_problems()
asked = json.loads(sys.stdin.read())
checked = problems if asked["keys"] is None else [find_problem(problems, key) for key in asked["keys"]]
controls = [replace(find_problem(problems, key), solution=code) for key, code in asked["controls"]]
results = check_solutions(checked + controls, device="cpu", seeds=(0, 1))
print(json.dumps([asdict(r) for r in results]))
"""

# A copy kernel posing as ReLU: it only passes when no input is negative.
COPY_AS_RELU = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
'''

# Right answer, no kernel: PyTorch does the work.
TORCH_ADD = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
'''


def _controls() -> list[tuple[str, str, str]]:
    """(problem key, wrong solution, the failure the check must report)."""
    layer_norm = find_problem(builtin_problems(), "1/10").solution
    assert layer_norm is not None and "centered * rstd * w + b" in layer_norm
    return [
        ("1/3", COPY_AS_RELU, "outputs differ"),
        ("1/1", TORCH_ADD, "launched no Triton kernel"),
        # Ignoring the learned scale must be caught: the reference's weights are not all ones.
        ("1/10", layer_norm.replace("centered * rstd * w + b", "centered * rstd + b"), "outputs differ"),
        # Parameter names differ from the reference's, so its weights cannot be copied in.
        ("1/11", find_problem(builtin_problems(), "1/11").solution.replace("self.weight", "self.gamma"), "state_dict"),
    ]


def _check_in_one_process(keys: list[str] | None) -> list[dict]:
    """The results of the problems `keys` (None: every built-in problem), then of the wrong solutions."""
    asked = {"keys": keys, "controls": [(key, code) for key, code, _ in _controls()]}
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(asked),
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, f"suite check process failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def suite_results() -> list[dict]:
    return _check_in_one_process(None)


@pytest.mark.slow  # every built-in problem under the Triton interpreter: about 10 s
@pytest.mark.timeout(300)
def test_every_builtin_solution_matches_its_reference(suite_results: list[dict]) -> None:
    problems = builtin_problems()
    results = suite_results[: len(problems)]
    assert [r["key"] for r in results] == [p.key for p in problems]
    failed = {r["key"]: r["failures"] for r in results if not r["ok"]}
    assert not failed, failed
    for r in results:
        assert r["failures"] == [] and r["max_abs_error"] <= 1e-4 * 50
        assert r["kernel_launches"] >= 2  # at least one launch per seed


@pytest.mark.slow  # rides along with every built-in problem's check
@pytest.mark.timeout(300)
def test_wrong_solutions_are_caught(suite_results: list[dict]) -> None:
    controls = _controls()
    results = suite_results[len(builtin_problems()) :]
    assert len(results) == len(controls)
    for (key, _, expected), result in zip(controls, results):
        assert result["key"] == key
        assert not result["ok"], f"{key}: a wrong solution passed"
        assert any(expected in failure for failure in result["failures"]), (key, result["failures"])


@pytest.mark.timeout(300)
def test_the_problems_of_the_wrong_solutions_pass_and_the_wrong_solutions_fail_in_one_process() -> None:
    """The check of the two tests above on the few problems the wrong solutions are for (the fast loop's)."""
    controls = _controls()
    keys = sorted({key for key, _, _ in controls})
    results = _check_in_one_process(keys)
    assert [r["key"] for r in results[: len(keys)]] == keys
    for r in results[: len(keys)]:
        assert r["ok"] and r["failures"] == [] and r["kernel_launches"] >= 2, r
    for (key, _, expected), result in zip(controls, results[len(keys):], strict=True):
        assert result["key"] == key and not result["ok"], f"{key}: a wrong solution passed"
        assert any(expected in failure for failure in result["failures"]), (key, result["failures"])
