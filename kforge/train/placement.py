"""Which GPUs run the rollout engines, the learner and the eval pool, and why.

Indices are logical (positions in CUDA_VISIBLE_DEVICES when it is set), for every role: the learner process,
the rollout worker and the eval pool each map their own to physical ids through `kforge.gpus` (the one
mapping) when they start a child with its own CUDA_VISIBLE_DEVICES.

The planner is pure (GPU count, memory per GPU and the model's memory in, a plan with its reasons out), so
every machine size is tested on a CPU. Its rules, for n GPUs:
- the compute GPUs are all n for n <= 2 and the first n-1 from 3 on: the eval pool times kernels on the
  last GPU, of its own, so timings are not skewed by the learner's step or the engines' decoding (with 1 or
  2 GPUs it shares the compute GPUs);
- an engine needs k GPUs (tensor parallel) only when its weights do not fit one GPU's share
  (`rollout.gpu_memory_utilization`); otherwise k = 1 and several GPUs get data-parallel engines;
- colocated when memory allows (the default): every compute GPU holds one engine replica (per k GPUs) AND
  one data-parallel learner rank; the engines sleep while the learner trains (the 1-GPU case is the same
  plan on one GPU). Memory rule: the learner's base weights plus the engine's share must fit
  COLOCATE_ROOM (90%) of a GPU: learner_gb + rollout.gpu_memory_utilization x gpu_gb <= 0.9 x gpu_gb. While
  an engine is awake (rollouts) the learner's base weights stay resident (reloading them every step costs
  more than it frees), so that is the moment both must fit; the learner starts first and vLLM refuses to
  start when less than its share is free. The last 10% holds the two processes' CUDA contexts and the
  learner's LoRA and optimiser state. Asleep (level 1) an engine keeps its weights in host RAM and frees
  them and its KV cache on the GPU, so the learner's activations get the rest of the GPU. So the host's RAM
  must also hold every slept engine's weights (HOST_ROOM of it, the rest for the processes themselves and
  the page cache): 7 engines of a 7B model put about 100 GB there;
- split otherwise (the learner's copy does not fit beside the engine's share), and whenever
  `rollout.max_staleness=1` (the next step's rollouts run while the learner trains: they need GPUs of their
  own): engines on the first GPUs, learner ranks on the rest of the compute GPUs. From 3 GPUs on the
  engines get the larger half of the compute GPUs (rounded up, at least one GPU left to the learner):
  decoding is most of a multi-turn step. (A step of long chains is bound by its longest chain, which an
  extra engine hardly shortens: docs/performance.md; the split is the best use of the GPUs, not a speed-up
  in proportion to them);
- a size that is unknown (no model config, no GPU listing) is assumed to fit, and the plan says so;
- `--gpus` / `placement.*` win: naming only the rollout or only the learner GPUs gives the other role the
  compute GPUs left (shared with the named ones when none is left);
- a plan the GPUs cannot hold is refused in one line: the learner's weights over a GPU's memory, more
  tensor-parallel GPUs than the machine has, a colocated plan over the memory rule that cannot be split, and
  `rollout.max_staleness=1` on a plan that puts the engine and the learner on the same GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kforge.errors import UserError
from kforge.gpus import check_indices, matches, query_gpus, visible_ids

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig

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
    host_gb: float | None = None  # the machine's RAM, where slept engines keep their weights

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

    def colocates(self) -> bool | None:
        """The memory rule of a colocated plan (the module's docstring says why); None = a size is unknown."""
        if not self.gpu_gb or self.learner_gb is None:
            return None
        return self.learner_gb + self.rollout_share * self.gpu_gb <= COLOCATE_ROOM * self.gpu_gb

    def sleeps_in_host(self, engines: int) -> bool | None:
        """Whether host RAM holds `engines` slept engines' weights; None = a size is unknown."""
        if not self.host_gb or self.rollout_gb is None:
            return None
        return engines * self.rollout_gb <= HOST_ROOM * self.host_gb

    def colocating_share(self, n: int) -> float:
        """The largest rollout.gpu_memory_utilization that colocates while the engine's weights still fit n
        GPUs' shares; 0 when none does (sizes known)."""
        share = int((COLOCATE_ROOM - (self.learner_gb or 0) / (self.gpu_gb or 1)) * 100) / 100
        return share if share > 0 and replace(self, rollout_share=share).rollout_gpus <= n else 0.0

    def weights(self) -> str:
        """The memory rule's numbers, for a message."""
        return (f"the learner's base weights (about {_gb(self.learner_gb)} GB) beside the engine's share "
                f"({self.rollout_share:g} x {_gb(self.gpu_gb)} GB)")


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def memory_for(cfg: KforgeConfig, gpus: list[str] | None = None) -> Memory:
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
                  cfg.rollout.gpu_memory_utilization, host_gb=_host_gb())


def _host_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return None


LEARNER_ROOM = 0.85  # of a GPU's memory for the base weights; activations and LoRA state need the rest
COLOCATE_ROOM = 0.9  # of a GPU's memory for the learner's weights and an awake engine's share together
HOST_ROOM = 0.7  # of the host's RAM for slept engines' weights
# Beside a training learner: a sleeping (level 1) vLLM engine keeps its CUDA context and some buffers (1-3 GiB,
# the upper end taken); an eval child its CUDA context and what its kernel's run left in its cache (a guess).
ENGINE_ASLEEP_GIB = 3.0
EVAL_WORKER_GIB = 1.0


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
        """"colocated": an engine and a learner rank share a GPU (the engines sleep while it trains);
        "split": they have GPUs of their own; "cpu": no GPU."""
        if not self.gpus:
            return "cpu"
        return "colocated" if set(self.rollout) & set(self.learner) else "split"

    @property
    def engines(self) -> int:
        return max(1, len(self.rollout) // self.rollout_tp)

    def names(self, role: str) -> str:
        """The role's GPUs for a message: logical index and, where it differs, the physical id."""
        return ",".join(str(i) if self.gpus[i] == str(i) else f"{i} ({self.gpus[i]})" for i in getattr(self, role))

    def describe(self) -> str:
        if self.mode == "cpu":
            return "placement: no GPU visible -> CPU mode (hf rollout, Triton interpreter, no timing)"
        parts = [f"{role}=GPU {','.join(map(str, getattr(self, role)))}" for role in ROLES]
        engines = f"{self.engines} engines" if self.engines > 1 else "the engine"
        note = (f" ({engines} capped and slept while the learner trains on the same GPU(s))"
                if self.mode == "colocated" else "")
        return f"placement [{self.mode}]: " + "  ".join(parts) + note

    def learner_reserve_gib(self, eval_workers_per_gpu: int) -> float:
        """GPU memory other roles keep on a learner GPU while the learner trains (the most over its GPUs):
        what `model.recompute_share=auto` leaves out of its budget. Rough: not measured per machine."""
        return max((ENGINE_ASLEEP_GIB * (i in self.rollout) + EVAL_WORKER_GIB * eval_workers_per_gpu * (i in self.eval)
                    for i in self.learner), default=0.0)

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


def _gpus(ids: list[int]) -> str:
    return ",".join(map(str, ids))


def plan_placement(gpus: list[str] | None = None, overrides: dict[str, list[int]] | None = None,
                   memory: Memory | None = None, pipelined: bool = False) -> Plan:
    """The plan for these visible GPUs (default: what `kforge.gpus` sees); `pipelined`: rollout.max_staleness
    >= 1. An override naming a GPU that is not visible is an error, also on a machine without GPUs (where CPU
    mode would silently ignore it)."""
    gpus = visible_ids() if gpus is None else gpus
    n = len(gpus)
    plan = Plan(gpus)
    overrides = {role: ids for role, ids in (overrides or {}).items() if ids}
    for role, ids in overrides.items():
        check_indices(ids, n, f"{role} GPU")  # a GpuIndexError names the role and what is visible
    if n == 0:
        return plan
    mem = memory or Memory()
    tp = plan.rollout_tp = mem.rollout_gpus
    if tp > n:
        raise PlacementError(
            f"the rollout engine needs {tp} GPUs for about {mem.rollout_gb:.0f} GB of weights "
            f"({mem.gpu_gb:.0f} GB per GPU at rollout.gpu_memory_utilization {mem.rollout_share:g}) and {n} "
            "GPU(s) are visible: raise rollout.gpu_memory_utilization, pick a smaller model or use more GPUs")
    if mem.learner_gb and mem.gpu_gb and mem.learner_gb > LEARNER_ROOM * mem.gpu_gb:
        raise PlacementError(
            f"the learner holds the whole base model on each of its GPUs (about {mem.learner_gb:.0f} GB) and a GPU "
            f"has {mem.gpu_gb:.0f} GB: set model.load_in_4bit=true, pick a smaller model or use larger GPUs")
    fits = mem.colocates()
    # The eval pool's own GPU from 3 on, unless one engine needs every GPU.
    compute = list(range(n)) if n <= 2 or tp > n - 1 else list(range(n - 1))
    engines = len(compute) // tp
    host = None if mem.sleeps_in_host(engines) is not False else (
        f"{engines} slept engine(s) would keep about {engines * (mem.rollout_gb or 0):.0f} GB of weights in host RAM, "
        f"over {HOST_ROOM:.0%} of its {mem.host_gb or 0:.0f} GB")
    if mem.rollout_gb is None or fits is None:
        plan.why.append("model or GPU size unknown here: assumed the engine fits one GPU and the learner's weights "
                        "fit beside its share (colocated); --gpus rollout=0 learner=1,... splits them")
    if fits is not False and not pipelined and host is None:
        _colocated(plan, n, compute, mem)
    elif _split(plan, n, compute, mem, pipelined, host):
        pass
    elif fits is not False and not pipelined:  # short of host RAM, and the GPUs cannot hold them apart
        _colocated(plan, n, compute, mem)
        plan.why.append(f"warning: {host}; the host may swap while the learner trains")
    else:
        raise _refusal(n, tp, mem, pipelined)
    if "rollout" in overrides or "learner" in overrides:  # the planned roles' reasons no longer hold
        del plan.why[int(mem.rollout_gb is None or fits is None):]
    if "eval" in overrides:
        plan.why[:] = [line for line in plan.why if not line.startswith("eval ")]
    _apply_overrides(plan, overrides, n)
    if plan.mode == "colocated" and (pipelined or fits is False):  # only overrides get here
        raise _refusal(n, tp, mem, pipelined, forced=True)
    if overrides and set(plan.eval) & (set(plan.learner) | set(plan.rollout)) and n >= 3:
        plan.why.append("eval shares a GPU with another role: kernel timings there can be skewed")
    return plan


def _colocated(plan: Plan, n: int, compute: list[int], mem: Memory) -> None:
    """One engine per `tp` compute GPUs and one learner rank per compute GPU, on the same GPUs."""
    tp, why = plan.rollout_tp, plan.why
    plan.rollout = compute[:len(compute) // tp * tp]
    plan.learner = list(compute)
    plan.eval = list(compute) if compute == list(range(n)) else [n - 1]
    fit = f": {mem.weights()} fit {COLOCATE_ROOM:.0%} of a GPU" if mem.colocates() else ""
    who = ("the engines sleep", "wake") if plan.engines > 1 else ("the engine sleeps", "wakes")
    why.append(f"colocated{fit}; {who[0]} while the learner trains (level 1: weights to host RAM, KV cache "
               f"freed) and {who[1]} for the rollouts")
    why.append(_engines_line(plan, mem))
    why.append(_learner_line(plan.learner))
    if plan.eval == [n - 1] and n >= 3:
        why.append(f"eval on GPU {n - 1} of its own: nothing else runs there while kernels are timed")
    elif n > 1:
        why.append("eval shares the GPUs (timed runs beside the engines' decoding are marked contended)"
                   + ("; every GPU serves the engine" if n >= 3 else ""))
    else:
        why.append("eval shares the GPU: kernels are timed beside the other roles")


def _split(plan: Plan, n: int, compute: list[int], mem: Memory, pipelined: bool, host: str | None = None) -> bool:
    """Engines and learner ranks on GPUs of their own; False when the GPUs cannot hold them apart. `host`:
    why host RAM cannot hold the slept engines, when that is why."""
    tp, why = plan.rollout_tp, plan.why
    if len(compute) - tp < 1:
        if n - tp < 1:
            return False
        compute = list(range(n))  # the eval pool gives up its own GPU: the learner needs one
    m = len(compute)
    # The larger half to the engines (decoding is most of a step; rounded up to whole engines), one GPU at
    # least to the learner.
    engines = max(1, min(-(-((m + 1) // 2) // tp), (m - 1) // tp))
    plan.rollout, plan.learner = compute[:engines * tp], compute[engines * tp:]
    plan.eval = [n - 1] if compute != list(range(n)) else plan.learner[-1:]
    if host is not None and not pipelined:
        why.append(f"split: {host}")
    elif pipelined:
        why.append("split: rollout.max_staleness=1 runs the next step's rollouts while the learner trains, so "
                   "they need GPUs of their own (0 would colocate them)")
    else:
        lower = mem.colocating_share(n)
        why.append(f"split: {mem.weights()} would take over {COLOCATE_ROOM:.0%} of a GPU"
                   + (f"; rollout.gpu_memory_utilization={lower:g} would colocate them" if lower else ""))
    line = _engines_line(plan, mem)
    if m >= 3 and tp == 1:
        line += ": decoding is most of a multi-turn step, so the engines get the larger half of the GPUs"
    why.append(line)
    why.append(_learner_line(plan.learner))
    if n >= 3 and plan.eval == [n - 1] and n - 1 not in plan.learner:
        why.append(f"eval on GPU {n - 1} of its own: nothing else runs there while kernels are timed")
    else:
        why.append(f"eval shares the learner's GPU {plan.eval[0]} (the learner is idle while kernels are timed, "
                   "unless rollout.max_staleness=1 overlaps them)")
    return True


def _engines_line(plan: Plan, mem: Memory) -> str:
    tp, k = plan.rollout_tp, plan.engines
    if tp == 1:
        return (f"rollout: {k} data-parallel engines, one per GPU {_gpus(plan.rollout)} (a problem's group stays on "
                "one engine, for its prefix cache)" if k > 1 else f"rollout: one engine on GPU {plan.rollout[0]}")
    span = f"GPUs {plan.rollout[0]}-{plan.rollout[-1]}"
    head = (f"rollout: one engine, tensor parallel over {span}" if k == 1 else
            f"rollout: {k} data-parallel engines, each tensor parallel over {tp} GPUs ({span})")
    return (f"{head}: about {_gb(mem.rollout_gb)} GB of weights do not fit one GPU's share ({mem.rollout_share:g} x "
            f"{_gb(mem.gpu_gb)} GB)")


def _learner_line(learner: list[int]) -> str:
    if len(learner) == 1:
        return f"learner on GPU {learner[0]}"
    return (f"learner: {len(learner)} data-parallel ranks on GPU {_gpus(learner)} (gradients summed; the update is "
            "one rank's on the whole batch)")


def _refusal(n: int, tp: int, mem: Memory, pipelined: bool, forced: bool = False) -> PlacementError:
    """Why no plan of these GPUs holds the run, in one line with what to do."""
    where = "--gpus / placement.* put the engine and the learner on the same GPU" if forced else (
        f"{n} GPU(s) cannot hold them apart" + (f" (the engine needs {tp})" if tp > 1 else ""))
    if pipelined:
        return PlacementError(f"rollout.max_staleness=1 runs the next step's rollouts while the learner trains, "
                              f"which needs them on different GPUs, and {where}: set rollout.max_staleness=0"
                              + ("" if forced else " or use more GPUs"))
    lower = mem.colocating_share(n)
    alone = 0.9  # split, an engine has its GPU to itself
    fixes = ([f"rollout.gpu_memory_utilization={lower:g} (colocated)"] if lower else []) + (
        [f"rollout.gpu_memory_utilization={alone:g} (split: an engine on one GPU)"]
        if n >= 2 and tp > 1 and (mem.rollout_gb or 0) <= alone * 0.8 * (mem.gpu_gb or 0) else []) + [
        "model.load_in_4bit=true"]
    return PlacementError(f"{mem.weights()} take over {COLOCATE_ROOM:.0%} of a GPU, and {where}: set "
                          f"{' or '.join(fixes)}, pick a smaller model or use more GPUs")


def _apply_overrides(plan: Plan, overrides: dict[str, list[int]], n: int) -> None:
    """`--gpus` / placement.* win. Naming one of the engine and the learner gives the other the compute
    GPUs the named one leaves, or the same GPUs (colocated) when none is left."""
    tp, why = plan.rollout_tp, plan.why
    for role, ids in overrides.items():
        setattr(plan, role, list(ids))
        why.append(f"{role} on GPU {_gpus(ids)}: set by --gpus or placement.{role}")
    if "rollout" in overrides and len(plan.rollout) % tp:
        raise PlacementError(
            f"rollout GPUs {_gpus(plan.rollout)}: each engine needs {tp} GPUs (tensor parallel: the weights do not "
            f"fit one), so give a multiple of {tp}")
    named = [role for role in ("rollout", "learner") if role in overrides]
    if len(named) == 1:
        other = "learner" if named == ["rollout"] else "rollout"
        compute = [i for i in range(n) if n <= 2 or i not in plan.eval] or list(range(n))
        left = [i for i in compute if i not in overrides[named[0]]]
        if other == "rollout":
            left = left[:len(left) // tp * tp]
        given = left or list(overrides[named[0]])
        if other == "rollout" and len(given) % tp:
            given = plan.rollout  # fewer GPUs than one engine needs: the planned ones
        setattr(plan, other, given)
        why.append(f"{other} on GPU {_gpus(given)}: " + ("the compute GPUs the " + named[0] + " leaves" if left
                                                         else "the same GPUs as the " + named[0]))
    if "rollout" in overrides and plan.engines > 1:
        why.append(f"rollout: {plan.engines} data-parallel engines, {tp} GPU(s) each; a problem's group stays on "
                   "one engine (its prefix cache)")
    if named and plan.mode == "colocated":
        why.append("colocated: the engines sleep while the learner trains on the GPUs they share")
    if named and "eval" not in overrides:
        why.append(f"eval on GPU {_gpus(plan.eval)} (planned)")
