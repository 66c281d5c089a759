"""The 2-problem x 3-sample x 3-turn batch whose returns and group advantages tests/credit/test_advantages.py works
out by hand (gamma 0.5); other credit tests reuse it."""

from __future__ import annotations

from kforge.policy.records import Trajectory, Turn

# Turn scores per problem, one row per trajectory (group index = row).
SCORES = {"A": [[0, 0, 1], [0, 1, 1], [1, 1, 1]], "B": [[0, 0, 0], [0, 0, 0], [0, 0, 2]]}


def batch() -> list[Trajectory]:
    trajectories = []
    for problem, rows in SCORES.items():
        for g, scores in enumerate(rows):
            turns = [
                Turn(index=t, prompt_ids=[1, 2, t], response_ids=[3 + g, 4, 5], response_text="",
                     logprobs=[-0.1, -0.2, -0.3], policy_version=7, score=float(s))
                for t, s in enumerate(scores)
            ]
            trajectories.append(Trajectory(problem_key=problem, group_index=g, turns=turns))
    return trajectories
