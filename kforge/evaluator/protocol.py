"""The parent <-> child protocol: request and answer names, what each answer may weigh, and the
problem text a candidate child is given.

Order (the parent drives, one request at a time, and accepts only the answer it asked for):

    child  -> READY     {durations, evidence}                     (after import and model build)
    parent -> trial     {id, seed, signed}   child -> TRIAL {id, meta, evidence}      (x trials, parent's order;
    parent -> sample    {positions | ALL}    child -> SAMPLES {values}                 outputs kept until asked)
    parent -> warmup    {seeds}              child -> WARM                            (fresh inputs)
    parent -> time      {seeds}              child -> TIMED {ms}                      (fresh inputs per call)
    parent -> sample    {positions}          child -> SAMPLES {values}                (outputs of every timed call)
    parent -> profile   {seed}               child -> PROFILE {coverage}              (GPU)
    parent -> bye

Any other message, a second answer, or a frame larger than the answer can be ends the child as
`crashed` with the flag `protocol_violation`.
"""

from __future__ import annotations

import ast
from typing import Any

# child -> parent
READY, TRIAL, WARM, TIMED, SAMPLES, PROFILE, BUILT, ERROR = (
    "ready", "trial", "warm", "timed", "samples", "profile", "built", "error")
# parent -> child
OP_TRIAL, OP_WARMUP, OP_TIME, OP_SAMPLE, OP_PROFILE, OP_COMPILE, OP_BYE = (
    "trial", "warmup", "time", "sample", "profile", "compile", "bye")

HEADROOM = 1 << 16  # JSON framing around the tensors of one answer
ALL = "all"  # a sample request for whole outputs (those small enough to move)


def output_bytes(outputs: list[Any]) -> int:
    """Bytes the tensors of one reference answer take (the bound for the candidate's answer)."""
    total = 0
    for o in outputs:
        nbytes = getattr(o, "nbytes", None)
        total += int(nbytes) if nbytes is not None else 64
    return total


def answer_bound(outputs: list[Any]) -> int:
    """The largest frame an honest answer with outputs like these can be."""
    return output_bytes(outputs) + 256 * len(outputs) + HEADROOM


def sample_bound(positions: list[Any], calls: int) -> int:
    """The largest frame of sampled values (`positions` per output) for `calls` kept outputs can be."""
    per_call = sum((int(p.numel()) * 16 + 256) if hasattr(p, "numel") else 256 for p in positions)
    return per_call * calls + HEADROOM


def inputs_only(problem_code: str) -> str:
    """The problem module without its Model class: what a candidate child needs to build inputs.

    The reference implementation never enters the candidate's process, so it cannot be re-executed
    from there (the candidate can still copy it from its prompt: the static checks and launch
    evidence deal with that)."""
    from kforge.evaluator.static_check import parse

    tree = parse(problem_code)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name == "Model")]
    return ast.unparse(tree) + "\n"
