"""Which GPUs run the rollout engine, the learner and the eval pool.

Indices are logical (positions in CUDA_VISIBLE_DEVICES when it is set), for every role: the learner process,
the rollout worker and the eval pool each map their own to physical ids through `kforge.gpus` (the one
mapping) when they start a child with its own CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kforge.gpus import GpuIndexError, check_indices, visible_ids

ROLES = ("rollout", "learner", "eval")


class PlacementError(ValueError):
    pass


@dataclass
class Plan:
    gpus: list[str]  # physical ids of the visible GPUs, in logical order
    rollout: list[int] = field(default_factory=list)
    learner: list[int] = field(default_factory=list)
    eval: list[int] = field(default_factory=list)

    @property
    def mode(self) -> str:
        if not self.gpus:
            return "cpu"
        return "shared" if set(self.rollout) & set(self.learner) else "split"

    def names(self, role: str) -> str:
        """The role's GPUs for a message: logical index and, where it differs, the physical id."""
        return ",".join(str(i) if self.gpus[i] == str(i) else f"{i} ({self.gpus[i]})" for i in getattr(self, role))

    def describe(self) -> str:
        if self.mode == "cpu":
            return "placement: no GPU visible -> CPU mode (hf rollout, Triton interpreter, no timing)"
        parts = [f"{role}=GPU {','.join(map(str, getattr(self, role)))}" for role in ROLES]
        note = " (rollout engine capped and slept while the learner runs)" if self.mode == "shared" else ""
        return f"placement [{self.mode}]: " + "  ".join(parts) + note


def parse_gpus_option(text: str) -> dict[str, list[int]]:
    """`rollout=0 learner=1 eval=2,3` (spaces or semicolons between roles)."""
    out: dict[str, list[int]] = {}
    for item in text.replace(";", " ").split():
        role, sep, ids = item.partition("=")
        if not sep or role not in ROLES:
            raise PlacementError(f"--gpus item {item!r}: expected ROLE=IDS with ROLE one of {', '.join(ROLES)}")
        try:
            out[role] = [int(x) for x in ids.split(",") if x != ""]
        except ValueError:
            raise PlacementError(f"--gpus item {item!r}: GPU ids must be integers like 0 or 2,3") from None
    return out


def plan_placement(gpus: list[str] | None = None, overrides: dict[str, list[int]] | None = None) -> Plan:
    """The plan for these visible GPUs (default: what `kforge.gpus` sees). An override naming a GPU that is
    not visible is an error, also on a machine without GPUs (where CPU mode would silently ignore it)."""
    gpus = visible_ids() if gpus is None else gpus
    n = len(gpus)
    plan = Plan(gpus)
    for role, ids in (overrides or {}).items():
        try:
            check_indices(ids, n, f"{role} GPU")
        except GpuIndexError as exc:
            raise PlacementError(str(exc)) from None
    if n == 0:
        return plan
    if n == 1:
        plan.rollout, plan.learner, plan.eval = [0], [0], [0]
    elif n == 2:
        # The learner is idle while kernels are timed, the rollout engine is not: eval shares the learner's GPU.
        plan.rollout, plan.learner, plan.eval = [0], [1], [1]
    else:
        plan.rollout, plan.learner, plan.eval = [0], [1], list(range(2, n))
    for role, ids in (overrides or {}).items():
        if ids:
            setattr(plan, role, list(ids))
    return plan
