"""What of a child reaches the policy's next prompt (threat model item 5): every field of a Verdict that
write_feedback reads is built by the parent, from the candidate's own source, kforge's words and numbers
the parent knows; the child's text (a traceback, a build log, its answers' shapes, its evidence, its plain
values) never passes through as it is."""

from __future__ import annotations

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator.compare import compare_outputs
from kforge.evaluator.feedback import MAX_LINES, MAX_TEXT, write_feedback
from kforge.evaluator.judge import flags_from_evidence, judge_trials, meta_mismatch
from kforge.evaluator.own_text import MAX_MESSAGE, candidate_error
from kforge.evaluator.verdict import Status, Verdict

CODE = ("import torch\n\n\ndef forward(x):\n    y = x.relu()\n    raise RuntimeError('bad shape of the kernel output')\n"
        + "\n" * 20)
PROBLEM = "def get_inputs():\n    return [torch.rand(48, 40)]\n"
VENV = "/home/alice/checkout/.venv"
GIT = "5a7b2c9e1f0d3b4a6c8e"
DIGITS = str(int(GIT[:12], 16))


def test_a_frame_whose_line_is_not_a_line_of_the_source_is_dropped() -> None:
    """`File "candidate.py", line <digits>`: the digits were the child's, and carried what it read."""
    text = (f'  File "/tmp/x/candidate.py", line {DIGITS}, in forward\n'
            '  File "/tmp/x/candidate.py", line 6, in forward\n'
            "    whatever the child says\n"
            "RuntimeError: bad shape\n")
    out = candidate_error(text, CODE, PROBLEM)
    assert DIGITS not in out and DIGITS[:6] not in out, out
    assert out.splitlines() == ["candidate.py, line 6, in forward",
                                "    raise RuntimeError('bad shape of the kernel output')",
                                "RuntimeError: bad shape"], out


def test_a_compiler_line_keeps_only_the_candidates_files_and_lines() -> None:
    """`WORDS.h(1): error:` carried the virtualenv's path and torch's git hash in the file name; a line number
    beyond the candidate's source carried digits. Only load_inline's own files, and lines the source can have."""
    dotted = VENV.strip("/").replace("/", ".")
    text = (f"{dotted}.{GIT}.h(1): error: bad shape\n"
            f"/tmp/build/cuda.cu({DIGITS}): error: bad shape\n"
            "/tmp/build/cuda.cu(5): error: bad shape\n"
            "/tmp/build/main.cpp:4:2: error: bad shape\n"
            "RuntimeError: Error building extension\n")
    out = candidate_error(text, CODE, PROBLEM)
    for host in ("alice", "checkout", "venv", GIT, GIT[:7], DIGITS):
        assert host not in out, (host, out)
    assert out.splitlines() == ["error: bad shape", "cuda.cu(5): error: bad shape", "main.cpp(4): error: bad shape",
                                "RuntimeError"], out  # the same line twice is shown once


def test_the_messages_together_hold_at_most_max_message_characters() -> None:
    """Eight compiler lines of 200 characters each once reached the prompt (1200 characters of the child's
    words where the README promised 300); now the messages of one error share MAX_MESSAGE."""
    words = ("bad shape of the kernel output " * 10)[:199]
    text = "".join(f"/tmp/build/cuda.cu({n}): error: {words}\n" for n in range(1, 9)) + "RuntimeError: x\n"
    out = candidate_error(text, CODE, PROBLEM)
    said = sum(len(line.split("error: ", 1)[1]) for line in out.splitlines() if "error: " in line)
    assert 0 < said <= MAX_MESSAGE, out
    assert len(out.splitlines()) <= MAX_LINES and len(out) <= MAX_TEXT
    plain = candidate_error("RuntimeError: " + words * 3, CODE, PROBLEM)
    assert len(plain.split(": ", 1)[1]) <= MAX_MESSAGE


def test_evidence_flags_carry_only_names_kforge_wrote() -> None:
    """`patched:` and `sandbox_denied:` flags came straight from the child's evidence and reached the
    feedback through describe_flag: any text the child chose."""
    ev = {"patched": ["patched:time.perf_counter", f"patched:{VENV}"], "denied": ["open:fd", f"{GIT} {VENV}"]}
    flags = flags_from_evidence([ev])
    assert flags == ["patched:time.perf_counter", "patched:unknown", "sandbox_denied:open:fd",
                     "sandbox_denied:unknown"], flags
    text = write_feedback(Verdict(Status.INCORRECT, flags=flags))
    assert VENV not in text and GIT not in text and "perf_counter" in text


def test_a_wrong_answer_is_described_without_the_childs_text() -> None:
    """A trial's answer shape and dtype, and a plain output's value, are the child's: the reason and the
    error text (both in the feedback) once quoted them as they were."""
    want = [[[48, 40], "torch.float32"]]
    said = meta_mismatch([[[48, int(DIGITS)], f"{VENV} {GIT}"]], want)
    assert DIGITS not in said and VENV not in said and GIT not in said, said
    assert said.startswith("shape (48, #) ?"), said
    assert "shape (1920,) torch.float32" in meta_mismatch([[[1920], "torch.float32"]], want)
    assert "shape (1920,) torch.float16" in meta_mismatch([[[1920], "torch.float16"]], want)
    res = compare_outputs([f"{VENV} {GIT}"], [3], EvaluatorConfig())
    assert not res.passed and VENV not in res.reason and GIT not in res.reason and "expected 3" in res.reason
    f = judge_trials([(1, False)], [said], [[None]], [{}], EvaluatorConfig())
    v = Verdict(Status.INCORRECT, trials=1, details={"reason": f.reasons[0]}, error="\n".join(f.reasons))
    text = write_feedback(v)
    assert VENV not in text and GIT not in text and DIGITS not in text, text
