"""Per-step metrics from a batch of trajectories, and the sinks they go to (JSONL, TensorBoard, W&B)."""

from __future__ import annotations

import logging
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kforge.eval.report import is_speed_key, speed_measured, summarize, trajectory_outcome
from kforge.evaluator.verdict import Status
from kforge.policy.records import Trajectory

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig
    from kforge.policy.runner import Rollouts
    from kforge.train.placement import Plan

log = logging.getLogger("kforge.train")


@dataclass
class StepTimes:
    rollout_s: float = 0.0  # waiting for this step's rollouts (less than their wall time when pipelined)
    learn_s: float = 0.0
    sync_s: float = 0.0
    sync_save_s: float = 0.0  # the learner writes the adapter folder
    sync_load_s: float = 0.0  # the engine loads it (the backend's own parts: `load_times`)
    sleep_s: float = 0.0  # colocated: the engines put to sleep before the learner's step, and woken after it
    wake_s: float = 0.0


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    out = {f"{prefix}/mean": statistics.fmean(values), f"{prefix}/max": max(values), f"{prefix}/min": min(values)}
    if len(values) > 1:
        out[f"{prefix}/std"] = statistics.pstdev(values)
    return out


def rollout_metrics(trajectories: list[Trajectory], levels: dict[str, int], per_level: bool = False) -> dict[str, float]:
    """Reward components, status rates, speedups, lengths, turns and early stops of one step; with
    `per_level`, reward and correctness per KernelBench level too (`level1/reward/mean`, ...)."""
    turns = [t for tr in trajectories for t in tr.turns]
    out: dict[str, float] = {}
    if not turns:
        return out
    out.update(_stats("reward", [t.score for t in turns]))
    # Timed runs that shared their GPU with a learner step or the engine's decoding (skewed speedups); a
    # verdict answered from the cache again is the same run.
    out["timing/contended"] = float(len({id(t.verdict) for t in turns
                                         if t.verdict is not None and t.verdict.details.get("timing_contended")}))
    components: dict[str, list[float]] = defaultdict(list)
    for t in turns:
        for name, value in t.reward_components.items():
            components[name].append(value)
    for name, values in components.items():
        out[f"reward_component/{name}"] = statistics.fmean(values)
    verdicts = [t.verdict for t in turns if t.verdict is not None]
    n = len(turns)
    out["rate/format_ok"] = sum(1 for t in turns if t.candidate is not None and t.candidate.code) / n
    out["rate/compiled"] = sum(1 for v in verdicts if v.status.compiled) / n
    out["rate/correct"] = sum(1 for v in verdicts if v.correct) / n
    out["rate/flagged"] = sum(1 for v in verdicts if v.flags) / n
    out["rate/truncated"] = sum(1 for t in turns if t.truncated) / n  # cut at rollout.max_tokens
    for status in Status:
        count = sum(1 for v in verdicts if v.status is status)
        if count:
            out[f"status/{status.value}"] = count / n
    out.update(_stats("speedup", [v.speedup for v in verdicts if v.correct and v.speedup]))
    out.update(_stats("length/response_tokens", [float(len(t.response_ids)) for t in turns]))
    out.update(_stats("length/prompt_tokens", [float(t.prompt_tokens or len(t.prompt_ids)) for t in turns]))
    out["turns/mean"] = statistics.fmean(len(tr.turns) for tr in trajectories)
    out["turns/early_stop_rate"] = sum(1 for tr in trajectories if tr.stop_reason in ("correct", "speedup_reached")) / len(
        trajectories
    )
    out["turns/dropped_attempts"] = float(sum(t.dropped_attempts for t in turns))
    summary = summarize([trajectory_outcome(tr, levels.get(tr.problem_key, 0)) for tr in trajectories])["overall"]
    out["fast_0"] = float(summary.get("fast_0") or 0.0)
    if speed_measured(summary):  # nothing timed (a CPU, or no correct kernel): no fast_1, not a 0 no clock gave
        out["fast_1"] = float(summary.get("fast_1") or 0.0)
    if per_level:
        out.update(level_metrics(trajectories, levels))
    return out


def level_metrics(trajectories: list[Trajectory], levels: dict[str, int]) -> dict[str, float]:
    by_level: dict[int, list[Trajectory]] = defaultdict(list)
    for tr in trajectories:
        by_level[levels.get(tr.problem_key, 0)].append(tr)
    out: dict[str, float] = {}
    for level, trs in sorted(by_level.items()):
        turns = [t for tr in trs for t in tr.turns]
        if not turns:
            continue
        out[f"level{level}/reward/mean"] = statistics.fmean(t.score for t in turns)
        out[f"level{level}/rate/correct"] = sum(1 for t in turns if t.verdict is not None and t.verdict.correct) / len(turns)
        out[f"level{level}/rate/compiled"] = (sum(1 for t in turns if t.verdict is not None and t.verdict.status.compiled)
                                              / len(turns))
    return out


def held_out_metrics(trajectories: list[Trajectory], levels: dict[str, int]) -> dict[str, float]:
    """`eval/...`: the KernelBench summary of the held-out problems, as `kforge eval` computes it."""
    summary = summarize([trajectory_outcome(tr, levels.get(tr.problem_key, 0)) for tr in trajectories])["overall"]
    measured = speed_measured(summary)
    return {f"eval/{k}": float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (measured or not is_speed_key(k))}


def step_metrics(step: int, epoch: int, rollouts: Rollouts, credit: dict[str, float], learned: dict[str, float],
                 times: dict[str, float], levels: dict[str, int], per_level: bool, restarts: int,
                 plan: Plan) -> dict[str, Any]:
    """One step's record for metrics.jsonl, TensorBoard and the dashboard, from that step's own objects."""
    from kforge.train.gpu import role_gpu_stats

    trajectories, stats = rollouts.trajectories, rollouts.stats
    turns = [t for tr in trajectories for t in tr.turns]
    roll_s = times.get("rollout_s", 0.0)
    out: dict[str, Any] = {"step": step, "time": time.time(), "epoch": epoch}
    out.update(rollout_metrics(trajectories, levels, per_level))
    out.update({f"advantage/{k}": float(v) for k, v in credit.items()})
    out.update(learned)
    out.update({
        "time/rollout_eval_s": roll_s, "time/learn_s": times.get("learn_s", 0.0), "time/sync_s": times.get("sync_s", 0.0),
        "time/sync_save_s": times.get("sync_save_s", 0.0), "time/sync_load_s": times.get("sync_load_s", 0.0),
        "time/sleep_s": times.get("sleep_s", 0.0), "time/wake_s": times.get("wake_s", 0.0),
        # generate_s: summed over engine calls; eval_sum_s: summed over evaluations (both overlap).
        "time/generate_s": stats.generate_s, "time/eval_sum_s": stats.eval_sum_s, "time/rollout_wall_s": stats.wall_s,
        "throughput/generate_tok_s": sum(len(t.response_ids) for t in turns) / stats.wall_s if stats.wall_s > 0 else 0.0,
        "throughput/eval_kernels_min": 60.0 * stats.evaluated / max(stats.wall_s, 1e-9),
        "eval/evaluated": float(stats.evaluated),
        "eval/cache_hits": float(stats.cache_hits),
        "rollout/worker_restarts": float(restarts),
    })
    out.update(role_gpu_stats(plan))
    return out


def stream_metrics(ages: list[int], in_flight: int, dropped: int, dropped_total: int, wait_s: float) -> dict[str, float]:
    """Continuous rollouts, one take: the taken groups' age in versions at the take (their oldest turn's
    staleness; `staleness/*` is per trained sample), groups in flight after it, groups dropped as too stale
    since the last take and in all, and the seconds the learner waited for its groups."""
    return {"stream/group_age_mean": statistics.fmean(ages) if ages else 0.0,
            "stream/group_age_max": float(max(ages, default=0)), "stream/groups_in_flight": float(in_flight),
            "stream/groups_dropped_stale": float(dropped), "stream/groups_dropped_stale_total": float(dropped_total),
            "time/wait_groups_s": wait_s}


def collapse_warnings(history: list[dict[str, Any]], current: dict[str, Any]) -> list[str]:
    """Early signs of a collapsing run, shown on the dashboard and written to the log."""
    warnings = []
    total = current.get("advantage/groups_total", 0.0)
    if total and current.get("advantage/groups_dropped", 0.0) >= total:
        warnings.append("every group had constant returns: no learning signal this step")
    lengths = [h["length/response_tokens/mean"] for h in history[-5:] if "length/response_tokens/mean" in h]
    now = current.get("length/response_tokens/mean")
    if lengths and now is not None:
        ref = statistics.fmean(lengths)
        if ref > 0 and (now > 2.0 * ref or now < 0.5 * ref):
            warnings.append(f"response length swung from {ref:.0f} to {now:.0f} tokens")
    if current.get("rate/format_ok", 1.0) == 0.0:
        warnings.append("no response had a parsable <KERNEL> block")
    if current.get("advantage/coverage_blind", 0.0):
        warnings.append("a coverage setting is on but no correct GPU verdict had a measured coverage")
    collapsed = int(current.get("advantage/template_collapsed_groups", 0.0))
    if collapsed:
        warnings.append(f"{collapsed} group(s) collapsed to one answer that was also given to other problems "
                        f"({current.get('advantage/template_share', 0.0):.0%} of answers are such templates): "
                        "a template earns no format or compile credit")
    if penalty_only(current) and len(history) >= PENALTY_ONLY_STEPS - 1 \
            and all(penalty_only(h) for h in history[-(PENALTY_ONLY_STEPS - 1):]) \
            and not (len(history) >= PENALTY_ONLY_STEPS and penalty_only(history[-PENALTY_ONLY_STEPS])):
        warnings.append(f"for {PENALTY_ONLY_STEPS} steps the only non-zero reward was the flagged-kernel penalty: the "
                        "model writes no kernel the reward can grade, so all it can learn is to avoid flagged code; "
                        "warm-start it on correct kernels first (`kforge sft`, then model.checkpoint=ADAPTER_DIR)")
    return warnings


# Steps in a row with only the penalty before that is said (once per such stretch).
PENALTY_ONLY_STEPS = 3


def penalty_only(metrics: dict[str, Any]) -> bool:
    """The step's only non-zero reward component was the flagged-kernel penalty."""
    components = {k: v for k, v in metrics.items() if k.startswith("reward_component/")}
    return bool(components.get("reward_component/penalty")) and all(
        v == 0.0 for k, v in components.items() if k != "reward_component/penalty")


class MetricSinks:
    """TensorBoard and W&B next to the run folder's metrics.jsonl; both optional and never required."""

    def __init__(self, run_path: str, cfg: KforgeConfig, resume_step: int = 0):
        self.tb = None
        self.wandb = None
        self.hist_every = cfg.log.tb_histograms_every
        if cfg.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=f"{run_path}/tensorboard", purge_step=resume_step + 1 if resume_step else None)
            except ImportError:
                log.warning("log.tensorboard is on but the tensorboard package is not installed; skipping it")
        if cfg.log.wandb_project:
            try:
                import wandb

                # The run's W&B id is kept in the run folder, so `--resume` continues the same W&B run.
                id_file = Path(run_path) / "wandb_id"
                run_id = id_file.read_text().strip() if id_file.is_file() else None
                # dir: W&B's own files go into the run folder, not ./wandb wherever train was started.
                self.wandb = wandb.init(project=cfg.log.wandb_project, name=cfg.log.wandb_name, id=run_id,
                                        config=cfg.model_dump(mode="json"), resume="allow", dir=str(run_path))
                if run_id is None and getattr(self.wandb, "id", None):
                    id_file.write_text(str(self.wandb.id))
            except ImportError:
                log.warning("log.wandb_project is set but wandb is not installed; skipping W&B")

    def write(self, step: int, metrics: dict[str, Any], histograms: dict[str, list[float]] | None = None) -> None:
        scalars = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
            if histograms and self.hist_every and step % self.hist_every == 0:
                for key, values in histograms.items():
                    if values:
                        self.tb.add_histogram(key, __import__("numpy").asarray(values), step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
