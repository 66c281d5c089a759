"""Reading kernels out of model responses: a table of real-looking outputs, good and broken."""

from __future__ import annotations

import ast

import pytest

from kforge.evaluator.verdict import Status
from kforge.policy.parsing import format_error_verdict, parse_response, split_thinking

KERNEL = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out'''

FIRST_TRY = KERNEL.replace("BLOCK=1024", "BLOCK=256")
CUT = KERNEL[: KERNEL.index("        relu_kernel[")]  # ends inside forward, but still valid Python
CUT_BROKEN = KERNEL[: KERNEL.index("(x, out, n, BLOCK=1024)") + 8]  # ends mid-call: not Python


SNIPPET = "def relu(x):\n    return x.clamp(min=0)"


def fenced(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code}\n```"


# (name, response, thinking flag, expected code or None, fragment of the parse error, expected thinking)
CASES = [
    ("good", f"<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>", False, KERNEL, None, None),
    ("good with prose around", f"Here is my kernel.\n<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>\nDone.", False, KERNEL, None, None),
    ("lowercase tags, py fence", f"<kernel>\n{fenced(KERNEL, 'py')}\n</kernel>", False, KERNEL, None, None),
    ("block without fence", f"<KERNEL>\n{KERNEL}\n</KERNEL>", False, KERNEL, None, None),
    ("fence left open in a closed block", f"<KERNEL>\n```python\n{KERNEL}\n</KERNEL>", False, KERNEL, None, None),
    (
        "two blocks: the last complete one wins",
        f"<KERNEL>\n{fenced(FIRST_TRY)}\n</KERNEL>\nWait, a bigger block is faster:\n<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>",
        False, KERNEL, None, None,
    ),
    # A finished answer beats a later one that was cut off, whether or not the cut one parses.
    (
        "complete block then a truncated one that parses",
        f"<KERNEL>\n{fenced(FIRST_TRY)}\n</KERNEL>\n<KERNEL>\n```python\n{CUT}",
        False, FIRST_TRY, None, None,
    ),
    (
        "complete block then a truncated one that does not parse",
        f"<KERNEL>\n{fenced(FIRST_TRY)}\n</KERNEL>\n<KERNEL>\n```python\n{CUT_BROKEN}",
        False, FIRST_TRY, None, None,
    ),
    ("truncated block that parses", f"<KERNEL>\n```python\n{CUT}", False, CUT.strip(), None, None),
    ("truncated block that does not parse", f"<KERNEL>\n```python\n{CUT_BROKEN}", False, None, "does not parse (line", None),
    ("cut right after the tag", "Sure.\n<KERNEL>\n", False, None, "before any code", None),
    ("fenceless: bare fenced block with ModelNew", f"Sure! Here it is:\n{fenced(KERNEL)}\nHope it helps.", False, KERNEL,
     None, None),
    (
        "fenceless: the last block that defines ModelNew",
        f"{fenced('x = torch.relu(x)')}\nFull version:\n{fenced(KERNEL)}\n{fenced('print(out)')}",
        False, KERNEL, None, None,
    ),
    ("fenceless, truncated fence that parses", f"Here:\n```python\n{CUT}", False, CUT.strip(), None, None),
    ("fenceless, truncated fence that does not parse", f"Here:\n```python\n{CUT_BROKEN}", False, None,
     "cut off inside a code block", None),
    ("code block without ModelNew", fenced(SNIPPET), False, None, "no code block defines class ModelNew", None),
    ("prose only", "I would use a Triton kernel with a block size of 1024.", False, None, "no <KERNEL> block", None),
    ("empty", "   \n", False, None, "empty", None),
    ("empty block", "<KERNEL>\n\n</KERNEL>", False, None, "block is empty", None),
    (
        "thinking then kernel",
        f"<think>\nReLU is elementwise; one program per 1024 elements.\n</think>\n<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>",
        True, KERNEL, None, "ReLU is elementwise; one program per 1024 elements.",
    ),
    (
        "template opened <think> in the prompt",
        f"Plan: load, max with zero, store.\n</think>\n<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>",
        True, KERNEL, None, "Plan: load, max with zero, store.",
    ),
    ("think only", "<think>\nI need a kernel that clamps at zero.\n</think>\n", True, None, "no <KERNEL> block after </think>",
     "I need a kernel that clamps at zero."),
    (
        "thinking cut off (a draft kernel inside does not count)",
        f"<think>\nDraft:\n<KERNEL>\n{fenced(FIRST_TRY)}\n</KERNEL>\nBut maybe",
        True, None, "ended inside <think>", None,
    ),
    (
        "kernel mentioned inside thinking, answer after it",
        f"<think>\nI will write <KERNEL> blocks.\n</think>\n<KERNEL>\n{fenced(KERNEL)}\n</KERNEL>",
        True, KERNEL, None, "I will write <KERNEL> blocks.",
    ),
]


@pytest.mark.parametrize("name,text,thinking,code,error,thought", CASES, ids=[c[0] for c in CASES])
def test_parse_table(name, text, thinking, code, error, thought):
    cand = parse_response(text, "1/3", "triton", thinking)
    assert cand.problem_key == "1/3" and cand.backend == "triton"
    if code is None:
        assert cand.code is None
        assert error is not None and error in cand.parse_error
    else:
        assert cand.parse_error is None
        assert cand.code == code
    if thought is not None:
        assert cand.thinking == thought


def test_truncated_code_is_only_taken_when_it_parses():
    good = parse_response(f"<KERNEL>\n```python\n{CUT}", "1/3")
    ast.parse(good.code)  # what was taken is Python
    bad = parse_response(f"<KERNEL>\n```python\n{CUT_BROKEN}", "1/3")
    assert bad.code is None


def test_complete_block_with_syntax_error_goes_to_the_evaluator():
    """A finished answer that does not compile is a compile error for the evaluator, not a format error."""
    broken = KERNEL.replace("def forward(self, x):", "def forward(self, x)")
    cand = parse_response(f"<KERNEL>\n{fenced(broken)}\n</KERNEL>", "1/3")
    assert cand.code == broken


def test_split_thinking_variants():
    assert split_thinking("no tags") == (None, "no tags", True)
    assert split_thinking("<think>a</think>b") == ("a", "b", True)
    assert split_thinking("a</think>b") == ("a", "b", True)
    assert split_thinking("<think>never closed") == ("never closed", "", False)


@pytest.mark.parametrize("thinking", [False, True])
def test_format_error_verdict_says_what_was_expected(thinking):
    cand = parse_response("I think a block size of 1024 is best.", "2/1", "cuda", thinking)
    verdict = format_error_verdict(cand, thinking)
    assert verdict.status is Status.FORMAT_ERROR and not verdict.correct
    assert cand.parse_error in verdict.feedback and verdict.error == cand.parse_error
    for part in ("<KERNEL>", "</KERNEL>", "ModelNew", "```python"):
        assert part in verdict.feedback
    assert ("<think>" in verdict.feedback) is thinking
