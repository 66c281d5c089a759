"""Reading the kernel (and the thinking) out of a model response.

Order of preference: the last complete <KERNEL>...</KERNEL> block (its fenced code, else its bare text);
an unterminated <KERNEL> block at the end (a truncated response) when what is there parses as Python; a
bare fenced code block that defines ModelNew. Code from a complete block goes to the evaluator even when
it does not parse (a syntax error is a compile error with line numbers, more useful than a format error);
truncated code must parse, since a cut-off module is not the model's answer.
"""

from __future__ import annotations

import re

from kforge.evaluator.static.static_check import parse
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.prompts import KERNEL_CLOSE, KERNEL_OPEN, THINK_CLOSE, THINK_OPEN
from kforge.policy.records import Candidate

_BLOCK = re.compile(re.escape(KERNEL_OPEN) + r"(.*?)" + re.escape(KERNEL_CLOSE), re.DOTALL | re.IGNORECASE)
_OPEN = re.compile(re.escape(KERNEL_OPEN), re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[ \t]*\n(.*?)(?:\n[ \t]*```|```)", re.DOTALL)
_CODE_LANGS = {"", "python", "py", "python3"}


def split_thinking(text: str) -> tuple[str | None, str, bool]:
    """(thinking, answer, closed). Handles a missing `<think>` (templates that open it in the prompt) and an
    unterminated one (closed=False, answer empty)."""
    close_at = text.rfind(THINK_CLOSE)
    open_at = text.find(THINK_OPEN)
    if close_at >= 0:
        start = open_at + len(THINK_OPEN) if 0 <= open_at < close_at else 0
        return text[start:close_at].strip(), text[close_at + len(THINK_CLOSE) :], True
    if open_at >= 0:
        return text[open_at + len(THINK_OPEN) :].strip(), "", False
    return None, text, True


def _syntax_problem(code: str) -> str | None:
    try:
        parse(code)  # under the pool's parse lock: it parses from its worker threads meanwhile
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    return None


def _unterminated_fence(text: str) -> str | None:
    """What follows an opening ``` that is never closed (an odd number of fence markers), else None."""
    markers = [m.start() for m in re.finditer("```", text)]
    if len(markers) % 2 == 0:
        return None
    line_end = text.find("\n", markers[-1])
    if line_end < 0:
        return ""
    lang = text[markers[-1] + 3 : line_end].strip().lower()
    if lang not in _CODE_LANGS:
        return None
    return text[line_end + 1 :]


def _code_in(block: str) -> tuple[str | None, bool]:
    """(code, complete) from the inside of a <KERNEL> block: an unterminated fence's remainder
    (complete=False), else the last complete python fence, else the bare text."""
    rest = _unterminated_fence(block)
    if rest is not None:
        return (rest.strip() or None), False
    fences = [m.group(2) for m in _FENCE.finditer(block) if m.group(1).lower() in _CODE_LANGS]
    if fences:
        code = fences[-1].strip()
        return (code or None), True
    bare = block.strip()
    return (bare or None), True


def parse_response(text: str, problem_key: str, backend: str = "triton", thinking: bool = False) -> Candidate:
    """The Candidate in `text`; `code=None` with a `parse_error` that says what was wrong."""

    def fail(why: str, thought: str | None = None) -> Candidate:
        return Candidate(problem_key=problem_key, code=None, backend=backend, thinking=thought, parse_error=why)

    def ok(code: str, thought: str | None) -> Candidate:
        return Candidate(problem_key=problem_key, code=code, backend=backend, thinking=thought)

    if not text or not text.strip():
        return fail("the response is empty")
    thought, answer, closed = split_thinking(text)
    if not closed:
        # A kernel written inside unfinished thinking is a draft, not the answer.
        return fail(f"the response ended inside {THINK_OPEN} (no {THINK_CLOSE}, no kernel after it)", thought)

    blocks = [m.group(1) for m in _BLOCK.finditer(answer)]
    for block in reversed(blocks):  # the last complete block wins; an empty one does not count
        code, _ = _code_in(block)  # a closed block is a finished answer, even with its fence left open
        if code is not None:
            return ok(code, thought)
    last_close = answer.lower().rfind(KERNEL_CLOSE.lower())
    tail_opens = [m for m in _OPEN.finditer(answer) if m.start() > last_close]
    if tail_opens:  # an unterminated block after the last complete one: truncated output
        code, _ = _code_in(answer[tail_opens[-1].end() :])
        if code is None:
            return fail(f"the response was cut off right after {KERNEL_OPEN}, before any code", thought)
        problem = _syntax_problem(code)
        if problem is None:
            return ok(code, thought)
        return fail(
            f"the response was cut off inside {KERNEL_OPEN} (no {KERNEL_CLOSE}) and the partial code does not "
            f"parse ({problem})",
            thought,
        )
    if blocks:
        return fail(f"the {KERNEL_OPEN} block is empty", thought)

    # No tags: accept a bare fenced block that defines ModelNew (the last such one).
    fences = [m.group(2).strip() for m in _FENCE.finditer(answer) if m.group(1).lower() in _CODE_LANGS]
    with_model = [c for c in fences if "ModelNew" in c]
    if with_model:
        return ok(with_model[-1], thought)
    rest = _unterminated_fence(answer)  # a truncated bare block
    if rest is not None and "ModelNew" in rest:
        problem = _syntax_problem(rest.strip())
        if problem is None:
            return ok(rest.strip(), thought)
        return fail(f"the response was cut off inside a code block and the partial code does not parse ({problem})", thought)
    if fences:
        return fail(f"no {KERNEL_OPEN} block, and no code block defines class ModelNew", thought)
    if thinking and thought is not None:
        return fail(f"no {KERNEL_OPEN} block after {THINK_CLOSE}", thought)
    return fail(f"no {KERNEL_OPEN} block and no code block in the response", thought)


def expected_format(thinking: bool = False) -> str:
    prefix = f"your reasoning inside {THINK_OPEN}...{THINK_CLOSE}, then " if thinking else ""
    return (
        f"Expected: {prefix}the complete Python module defining class ModelNew inside {KERNEL_OPEN} and "
        f"{KERNEL_CLOSE}, as one ```python fenced code block, with nothing after {KERNEL_CLOSE}."
    )


def format_error_verdict(candidate: Candidate, thinking: bool = False) -> Verdict:
    """The verdict of a response with no readable kernel (never sent to the evaluator)."""
    why = candidate.parse_error or "no kernel could be read from the response"
    return Verdict(
        status=Status.FORMAT_ERROR,
        feedback=f"Format error: {why}. {expected_format(thinking)}",
        error=why,
    )
