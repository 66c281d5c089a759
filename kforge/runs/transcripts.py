"""Per-step transcripts: `samples/step_N.jsonl`, one line per trajectory, so reward hacking and turn
dynamics can be read without a debugger (`kforge runs show NAME --step N [--problem P]`).

A line holds the trajectory's turns: the prompt by reference (its hash and length; the prompt is the
problem plus the earlier turns of the same line), the response, the verdict, the score and its parts,
the return and the advantage. A step's file stops at `log.samples_max_mb`; its last line then says how
many trajectories were left out.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kforge.policy.records import Trajectory


def trajectory_record(traj: Trajectory) -> dict[str, Any]:
    turns = []
    for t in traj.turns:
        v = t.verdict
        turns.append({
            "turn": t.index + 1,
            "prompt_sha": hashlib.sha256(repr(t.prompt_ids).encode()).hexdigest()[:16],
            "prompt_tokens": t.prompt_tokens or len(t.prompt_ids),
            "dropped_attempts": t.dropped_attempts,
            "policy_version": t.policy_version,
            "response": t.response_text,
            "response_tokens": len(t.response_ids),
            "status": v.status.value if v is not None else None,
            "flags": list(v.flags) if v is not None else [],
            "speedup": v.speedup if v is not None else None,
            "feedback": v.feedback if v is not None else "",
            "score": t.score,
            "reward_components": t.reward_components,
            "return": t.return_,
            "advantage": t.advantage,
        })
    return {"problem": traj.problem_key, "group": traj.group_index, "stop_reason": traj.stop_reason, "turns": turns}


def write_transcript(path: Path, step: int, trajectories: list[Trajectory], max_bytes: int) -> int:
    """Write the step's trajectories up to `max_bytes`; returns how many were written. Written whole and
    renamed into place (a step redone after a resume replaces its file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written, size = 0, 0
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        for traj in trajectories:
            line = json.dumps({"step": step, **trajectory_record(traj)}, default=str) + "\n"
            if size + len(line) > max_bytes:
                fh.write(json.dumps({"step": step, "truncated": len(trajectories) - written,
                                     "reason": f"log.samples_max_mb reached ({max_bytes} bytes)"}) + "\n")
                break
            fh.write(line)
            size += len(line)
            written += 1
    tmp.replace(path)
    return written


def read_transcript(path: Path, problem: str | None = None) -> list[dict[str, Any]]:
    """The lines of a step's transcript; with `problem` (a key like 1/19) only that problem's."""
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if problem is None or "truncated" in rec or rec.get("problem") == problem:
                out.append(rec)
    return out
