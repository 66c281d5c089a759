"""Short feedback text for the model's next turn, and cleaning of child error output."""

from __future__ import annotations

import re

from kforge.evaluator.verdict import Status, Verdict

_FLAG_TEXT = {
    "no_kernel_launched": "no custom kernel was launched during forward",
    "try_except_fallback": "a try/except falls back to PyTorch",
    "subclasses_reference_model": "ModelNew subclasses the reference Model",
    "calls_reference_model": "the reference Model is used",
    "imports_reference_model": "the reference Model is imported",
    "output_aliases_input": "an output shares memory with an input",
    "returns_input": "an output is one of the inputs",
    "identical_outputs_across_trials": "outputs do not change with the inputs (memoised or constant)",
    "kernel_not_on_trial_data": "the kernel never touched the inputs or outputs: PyTorch did the work",
    "timed_output_mismatch": "outputs of the timed calls were wrong (caching or skipped work)",
    "timing_inconsistent": "the reported time disagrees with the evaluator's own clock",
    "failed_when_timed": "failed or hung when called again for timing",
    "protocol_violation": "the process sent messages the evaluator did not ask for",
    "kernel_not_needed": "the outputs were right with the candidate's kernels skipped: PyTorch did the work",
    "output_not_from_kernel": ("an output was made by PyTorch, or written by it after the candidate's last kernel "
                               "on it, not written by the candidate's kernels"),
    "timed_call_without_kernel": "a timed call ran none of the candidate's kernels on its data",
}

_CATEGORY = {
    Status.FORMAT_ERROR: "Format error",
    Status.STATIC_CHECK_FAILED: "Rejected before running",
    Status.COMPILE_ERROR: "Compilation failed",
    Status.RUNTIME_ERROR: "Runtime error",
    Status.TIMEOUT: "Timed out",
    Status.CRASHED: "Crashed",
    Status.INCORRECT: "Incorrect output",
    Status.CORRECT: "Correct",
    Status.UNSUPPORTED: "Unsupported",
}


def describe_flag(flag: str) -> str:
    if flag.startswith("pytorch_op:"):
        return f"calls the PyTorch op `{flag.split(':', 1)[1]}` that the kernel should replace"
    if flag.startswith("patches:") or flag.startswith("patched:"):
        return f"replaces `{flag.split(':', 1)[1]}`"
    if flag.startswith("sandbox_denied:"):
        return f"tried `{flag.split(':', 1)[1]}`, which a kernel may not use"
    return _FLAG_TEXT.get(flag, flag)


_HIDDEN_FRAME = re.compile(r"kforge/evaluator/|<frozen |runpy|torch/nn/modules/module\.py")
_CARET = re.compile(r"^\s*[\^~]+\s*$")
# The tail of a frame line whose head was cut off (the child sends only the end of a long traceback).
_CUT_FRAME = re.compile(r'^[^"]*", line \d+, in \S+$')


# What of a child's own text may reach the policy's next prompt and the transcripts: the child may have
# read anything its sandbox lets it read, so what it can pass on this way is kept small (own_text.py builds
# a candidate's; its chosen words, the messages, hold at most own_text.MAX_MESSAGE characters of these).
MAX_LINE, MAX_LINES, MAX_TEXT = 200, 8, 1200


def clean_error(text: str, scratch: str | None, secrets: list[str], max_lines: int = MAX_LINES) -> str:
    """The most useful few lines of a traceback: the candidate's frames and the error itself.

    Harness frames, caret lines, sandbox paths and secret values are removed; library paths are
    shortened to the file name; lines are cut at MAX_LINE characters and the whole at MAX_TEXT.
    """
    if scratch:
        text = text.replace(scratch.rstrip("/") + "/", "").replace(scratch, ".")
    text = re.sub(r"/tmp/kforge-[\w.-]+/", "", text)
    for s in secrets:
        text = text.replace(s, "***")
    out: list[str] = []
    keep_frame = True
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or _CARET.match(line) or stripped.startswith("Traceback (most recent call last)"):
            continue
        if stripped.startswith("Extension modules:") or stripped.startswith("Current thread") \
                or stripped.startswith("Thread 0x"):
            continue
        if _CUT_FRAME.match(stripped):  # whose frame it was is unknown: hide it and its source line
            keep_frame = False
            continue
        if stripped.startswith('File "'):
            keep_frame = not _HIDDEN_FRAME.search(stripped)
            if keep_frame:
                line = re.sub(r'File "[^"]*/([^/"]+)"', r'File "\1"', line)
                out.append(line[:MAX_LINE])
            continue
        if line.startswith("    ") and not keep_frame:
            continue  # source line of a hidden frame
        keep_frame = True
        if line[:MAX_LINE] not in out[-1:]:
            out.append(line[:MAX_LINE])
    return "\n".join(out[-max_lines:])[-MAX_TEXT:]


def write_feedback(v: Verdict) -> str:
    parts = [f"{_CATEGORY.get(v.status, v.status.value)}."]
    if v.status in (Status.INCORRECT, Status.CORRECT) and v.trials:
        parts.append(f"{v.trials_passed}/{v.trials} correctness trials passed.")
    if v.max_abs_error and v.status is Status.INCORRECT:
        parts.append(f"Max abs error {v.max_abs_error:.3g}.")
    reason = v.details.get("reason")
    if reason:
        parts.append(str(reason).rstrip(".") + ".")
    if v.flags:
        parts.append("Not accepted: " + "; ".join(describe_flag(f) for f in v.flags[:4]) + ".")
    if v.speedup is not None and v.kernel_ms is not None:
        base = v.baseline.mean_ms if v.baseline else None
        parts.append(f"Runtime {v.kernel_ms:.4g} ms" + (f" vs PyTorch {base:.4g} ms" if base else "")
                     + f": speedup {v.speedup:.2f}x.")
    elif v.status is Status.CORRECT and not v.timing_meaningful:
        parts.append("Speed not measured on this machine.")
    text = " ".join(parts)
    if v.error:
        text += "\n" + v.error
    return text
