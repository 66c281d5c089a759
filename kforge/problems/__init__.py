"""KernelBench-format problems: the record, where they come from, and how a run picks them."""

from kforge.problems.hub import hub_blocker, split_runnable
from kforge.problems.record import Problem
from kforge.problems.selection import (
    find_problem,
    load_problems,
    problems_from_config,
    select_problems,
    split_problems,
    training_keys,
)
from kforge.problems.sources import ProblemSourceError, builtin_problems

__all__ = [
    "Problem",
    "ProblemSourceError",
    "builtin_problems",
    "find_problem",
    "hub_blocker",
    "load_problems",
    "problems_from_config",
    "select_problems",
    "split_problems",
    "split_runnable",
    "training_keys",
]
