"""Which GPUs run the rollout engine, the learner and the eval pool, and why.

Indices are logical (positions in CUDA_VISIBLE_DEVICES when it is set), for every role: the learner process,
the rollout worker and the eval pool each map their own to physical ids through `kforge.gpus` (the one
mapping) when they start a child with its own CUDA_VISIBLE_DEVICES.

The planner is pure (GPU count, memory per GPU and the model's memory in, a plan with its reasons out), so
every machine size is tested on a CPU. Its rules, for n GPUs:
- the rollout engine gets one GPU; tensor parallel over k only when the weights do not fit one GPU's
  share (`rollout.gpu_memory_utilization`);
- the eval pool times kernels on a GPU of its own from 3 GPUs on (the last one): nothing else runs there,
  so timings are not skewed by the learner's step or the engine's decoding; with 2 GPUs it shares the
  learner's (idle while kernels are timed unless pipelined), with 1 everything shares it;
- every other GPU is a data-parallel learner rank (each holds the whole base model);
- a plan the GPUs cannot hold (the learner's weights over a GPU's memory, more tensor-parallel GPUs than the
  machine has) is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any

from kforge.errors import UserError
from kforge.gpus import check_indices, matches, query_gpus, visible_ids

ROLES = ("rollout", "learner", "eval")


class PlacementError(UserError):
    pass


@dataclass(frozen=True)
class Memory:
    """What the plan must hold, in GB; None = unknown (the plan says it assumed the model fits)."""

    gpu_gb: float | None = None  # the smallest visible GPU's memory
    rollout_gb: float | None = None  # the engine's weights
    learner_gb: float | None = None  # the learner's base weights (4-bit when model.load_in_4bit)
    rollout_share: float = 0.5  # rollout.gpu_memory_utilization

    @property
    def rollout_gpus(self) -> int:
        """GPUs the engine's weights need: 1 unless they overflow one GPU's share (tensor parallel)."""
        if not self.gpu_gb or not self.rollout_gb:
            return 1
        room = self.gpu_gb * self.rollout_share * 0.8  # the rest of the share is the KV cache
        k = 1
        while self.rollout_gb / k > room and k < 64:
            k *= 2  # attention heads divide by powers of two
        return k


def memory_for(cfg: Any, gpus: list[str] | None = None) -> Memory:
    """The Memory record of this machine and config: the smallest visible GPU (read through the driver) and
    the model's weights counted from its config (no weights are read)."""
    from kforge.modelio import parameter_count

    gpus = visible_ids() if gpus is None else gpus
    listing, _ = query_gpus() if gpus else (None, "")
    sizes = [g.total_mib / 1024 for e in gpus for g in listing or [] if matches(e, g)]
    params = parameter_count(cfg.model.name, cfg.model.gguf_file, cfg.model.trust_remote_code) if gpus else None
    if params is None:
        return Memory(min(sizes) if sizes else None, rollout_share=cfg.rollout.gpu_memory_utilization)
    width = 4 if cfg.model.dtype == "float32" else 2
    learner = 0.55 if cfg.model.load_in_4bit else width  # 4-bit blocks plus their scales, norms in full width
    return Memory(min(sizes) if sizes else None, params * width / 2**30, params * learner / 2**30,
                  cfg.rollout.gpu_memory_utilization)


LEARNER_ROOM = 0.85  # of a GPU's memory for the base weights; activations and LoRA state need the rest


@dataclass
class Plan:
    gpus: list[str]  # physical ids of the visible GPUs, in logical order
    rollout: list[int] = field(default_factory=list)
    learner: list[int] = field(default_factory=list)
    eval: list[int] = field(default_factory=list)
    why: list[str] = field(default_factory=list)  # one line per decision, for --dry-run and the dashboard
    rollout_tp: int = 1  # GPUs per engine; the rollout GPUs hold len(rollout) / rollout_tp engine replicas

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

    def explain(self) -> str:
        """The plan and why, one decision per line."""
        return "\n".join([self.describe()] + [f"  - {line}" for line in self.why])


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


def plan_placement(gpus: list[str] | None = None, overrides: dict[str, list[int]] | None = None,
                   memory: Memory | None = None) -> Plan:
    """The plan for these visible GPUs (default: what `kforge.gpus` sees). An override naming a GPU that is
    not visible is an error, also on a machine without GPUs (where CPU mode would silently ignore it)."""
    gpus = visible_ids() if gpus is None else gpus
    n = len(gpus)
    plan = Plan(gpus)
    overrides = {role: ids for role, ids in (overrides or {}).items() if ids}
    for role, ids in overrides.items():
        check_indices(ids, n, f"{role} GPU")  # a GpuIndexError names the role and what is visible
    if n == 0:
        return plan
    mem = memory or Memory()
    why = plan.why
    tp = mem.rollout_gpus
    if tp > n:
        raise PlacementError(
            f"the rollout engine needs {tp} GPUs for about {mem.rollout_gb:.0f} GB of weights "
            f"({mem.gpu_gb:.0f} GB per GPU at rollout.gpu_memory_utilization {mem.rollout_share:g}) and {n} "
            "GPU(s) are visible: raise rollout.gpu_memory_utilization, pick a smaller model or use more GPUs")
    if mem.learner_gb and mem.gpu_gb and mem.learner_gb > LEARNER_ROOM * mem.gpu_gb:
        raise PlacementError(
            f"the learner holds the whole base model on each of its GPUs (about {mem.learner_gb:.0f} GB) and a GPU "
            f"has {mem.gpu_gb:.0f} GB: set model.load_in_4bit=true, pick a smaller model or use larger GPUs")
    if mem.rollout_gb is None or mem.gpu_gb is None:
        why.append("model size unknown here: assumed to fit one GPU")
    plan.rollout = list(range(tp))
    why.append("rollout: one engine on GPU 0" if tp == 1 else
               f"rollout: one engine, tensor parallel over GPUs 0-{tp - 1}: about {mem.rollout_gb:.0f} GB of weights "
               f"do not fit one GPU's share ({mem.rollout_share:g} x {mem.gpu_gb:.0f} GB)")
    rest = list(range(tp, n))
    if not rest:  # every GPU serves the engine: the learner shares them while it sleeps
        plan.learner, plan.eval = list(plan.rollout), list(plan.rollout)
        why.append("learner and eval share the engine's GPU(s): the engine is capped and slept while the learner "
                   "trains" + ("" if n > 1 else "; kernels are timed beside the other roles"))
    elif len(rest) == 1:
        plan.learner, plan.eval = rest, rest
        why.append(f"learner on GPU {rest[0]}; eval shares it (the learner is idle while kernels are timed, "
                   "unless rollout.max_staleness=1 overlaps them)")
    else:
        plan.learner, plan.eval = rest[:-1], rest[-1:]
        ranks = len(plan.learner)
        why.append(f"learner: {ranks} data-parallel rank(s) on GPU {','.join(map(str, plan.learner))}"
                   + (" (gradients summed; the update is one rank's on the whole batch)" if ranks > 1 else ""))
        why.append(f"eval on GPU {rest[-1]} of its own: nothing else runs there while kernels are timed")
    plan.rollout_tp = tp
    for role, ids in overrides.items():
        setattr(plan, role, list(ids))
        why.append(f"{role} on GPU {','.join(map(str, ids))}: set by --gpus or placement.{role}")
    if "rollout" in overrides:
        if len(plan.rollout) % tp:
            raise PlacementError(
                f"rollout GPUs {','.join(map(str, plan.rollout))}: each engine needs {tp} GPUs (tensor parallel: the "
                f"weights do not fit one), so give a multiple of {tp}")
        if len(plan.rollout) > tp:
            why.append(f"rollout: {len(plan.rollout) // tp} data-parallel engines, {tp} GPU(s) each; a problem's "
                       "group stays on one engine (its prefix cache)")
    if overrides and set(plan.eval) & (set(plan.learner) | set(plan.rollout)) and n >= 3:
        why.append("eval shares a GPU with another role: kernel timings there can be skewed")
    return plan
