"""KernelBench-format problems: the record, where they come from, and how a run picks them."""

from kforge.problems.record import Problem
from kforge.problems.selection import find_problem, problems_from_config, select_problems, split_problems
from kforge.problems.sources import ProblemSourceError, builtin_problems, load_problems

__all__ = [
    "Problem",
    "ProblemSourceError",
    "builtin_problems",
    "find_problem",
    "load_problems",
    "problems_from_config",
    "select_problems",
    "split_problems",
]
