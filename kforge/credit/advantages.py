"""Multi-turn credit assignment: discounted per-turn returns and group-relative advantages.

Each turn of a trajectory is its own training sample. Its return is its own score plus the
discounted scores of the turns that followed it (R_t = s_t + gamma * R_{t+1}), so a turn that set up
a later success gets part of the credit. The group that a turn is compared with is every trajectory of
the same problem at the same turn index (Kevin-32B's baseline per task and turn).

TRLOO (Dr. Kernel's turn-level REINFORCE leave-one-out) is ``advantage_baseline=leave_one_out`` on these
per-(problem, turn) groups: A_i = R_i - mean of the other n-1 returns = n/(n-1) (R_i - group mean). The
group mean includes the sample itself, which shrinks every advantage by (n-1)/n; leaving it out removes
that bias, which matters for the small groups of late turns (fewer trajectories are still running).

Rejection: with ``learner.min_coverage`` set, turns whose measured coverage (share of GPU time in the
candidate's own kernels) is below it are left out before the groups are formed ("lazy optimisation":
a trivial op moved to Triton while the heavy op stays in PyTorch). Unmeasured coverage (None) is never
rejected. That fails open: if the profiler stops giving a total (an API change), every verdict has
coverage None and both ``min_coverage`` and the coverage-scaled speed reward switch off. So the stats
report the share of correct GPU verdicts (timing meaningful) that have a coverage, and a warning is
logged when a coverage setting is on, there were such verdicts, and none had one (``coverage_blind``).
"""

from __future__ import annotations

import logging
import math
import random
from collections import defaultdict

from kforge.config.losses import loss_rule
from kforge.config.schema import LearnerConfig, RewardConfig
from kforge.credit.samples import Sample
from kforge.policy.records import Trajectory, Turn

EPS = 1e-6

log = logging.getLogger("kforge.credit")


def assign_returns(trajectories: list[Trajectory], gamma: float) -> None:
    """Set ``turn.return_`` of every turn from the turn scores (``turn.score``), last turn first."""
    for trajectory in trajectories:
        later = 0.0
        for turn in reversed(trajectory.turns):
            later = turn.score + gamma * later
            turn.return_ = later


def low_coverage(turn: Turn, min_coverage: float | None) -> bool:
    """The turn's kernel was profiled and spends less than ``min_coverage`` of its GPU time in its own kernels."""
    coverage = turn.verdict.coverage if turn.verdict is not None else None
    return min_coverage is not None and coverage is not None and coverage < min_coverage


def unjudged(turn: Turn) -> bool:
    """The turn's verdict is the reference's failure, not the candidate's (evaluator: `reference_error`, e.g. the
    reference out of memory beside a busy pool): its score says nothing of the answer."""
    return turn.verdict is not None and bool(turn.verdict.details.get("reference_error"))


def coverage_stats(turns: list[Turn], coverage_in_use: bool) -> dict[str, float]:
    """Correct GPU verdicts (correct, timing meaningful: not the CPU interpreter), the share of them with a
    measured coverage (1 when there are none), and whether a coverage setting is on but blind."""
    gpu_correct = [t.verdict for t in turns if t.verdict is not None and t.verdict.correct and t.verdict.timing_meaningful]
    measured = sum(1 for v in gpu_correct if v.coverage is not None and math.isfinite(v.coverage))
    share = measured / len(gpu_correct) if gpu_correct else 1.0
    blind = coverage_in_use and bool(gpu_correct) and measured == 0
    return {"coverage_gpu_correct": float(len(gpu_correct)), "coverage_measured_share": share,
            "coverage_blind": float(blind)}


def uses_std(cfg: LearnerConfig) -> bool:
    """normalize_std=None means: std-normalise for grpo only (Dr.GRPO and the others leave it out)."""
    return loss_rule(cfg.loss_fn).normalize_std if cfg.normalize_std is None else cfg.normalize_std


def group_advantages(returns: list[float], baseline: str, normalize_std: bool, correct_score: float = 0.0) -> list[float]:
    """Advantages of one group. ``leave_one_out`` compares each member with the mean of the others;
    a group of one has no baseline to compare with and gets 0. The std is the population std of the
    group's returns, floored at the std of one ``correct_score`` among n - 1 zeros: a group whose
    spread is only shaping credit (format, compile) keeps that credit's share of a correct answer's
    advantage instead of being blown up to it."""
    n = len(returns)
    mean = sum(returns) / n
    if baseline == "mean":
        adv = [r - mean for r in returns]
    elif baseline == "leave_one_out":
        adv = [0.0] * n if n == 1 else [r - (mean * n - r) / (n - 1) for r in returns]
    else:
        raise ValueError(f"learner.advantage_baseline {baseline!r} is unknown; use mean or leave_one_out")
    if normalize_std:
        std = math.sqrt(sum((r - mean) ** 2 for r in returns) / n)
        adv = [a / (max(std, correct_score * math.sqrt(n - 1) / n) + EPS) for a in adv]
    return adv


def build_samples(
    trajectories: list[Trajectory], cfg: LearnerConfig, reward: RewardConfig | None = None, seed: int = 0
) -> tuple[list[Sample], dict[str, float]]:
    """Samples with advantages (also written to ``turn.advantage``) and group statistics.

    Call ``assign_returns`` first. With ``remove_constant_reward_groups``, groups whose returns are
    all equal (no learning signal, only noise through KL and clipping) produce no samples at all.
    ``reward`` (the run's RewardConfig) gives the score of a correct answer (``correctness_weight``), the
    floor of a group's std under std normalisation, and whether a blind coverage is warned about
    (``coverage_scaled_speed``). With ``shuffle_advantages`` the advantages are permuted across the samples
    by ``seed`` (the step's).
    """
    correct_score = reward.correctness_weight if reward is not None else 0.0
    coverage_scaled_speed = reward is not None and reward.coverage_scaled_speed
    groups: dict[tuple[str, int], list[Turn]] = defaultdict(list)
    rejected = unjudged_turns = 0
    for trajectory in trajectories:
        for turn in trajectory.turns:
            if unjudged(turn):  # no signal, and its near-zero score would drag its group's baseline down
                unjudged_turns += 1
                turn.advantage = 0.0
                continue
            if low_coverage(turn, cfg.min_coverage):
                rejected += 1
                turn.advantage = 0.0
                continue
            groups[(trajectory.problem_key, turn.index)].append(turn)

    normalize = uses_std(cfg)
    samples: list[Sample] = []
    owners: list[Turn] = []
    dropped = truncated = 0
    for (problem_key, turn_index), turns in groups.items():
        returns = [t.return_ for t in turns]
        if cfg.remove_constant_reward_groups and max(returns) - min(returns) <= 1e-12:
            dropped += 1
            for turn in turns:
                turn.advantage = 0.0
            continue
        for turn, adv in zip(turns, group_advantages(returns, cfg.advantage_baseline, normalize, correct_score)):
            turn.advantage = adv
            if cfg.drop_truncated and turn.truncated:
                truncated += 1
                continue  # in the baseline, not in the loss
            samples.append(
                Sample(
                    prompt_ids=list(turn.prompt_ids),
                    response_ids=list(turn.response_ids),
                    advantage=adv,
                    rollout_logprobs=list(turn.logprobs),
                    policy_version=turn.policy_version,
                    problem_key=problem_key,
                    turn_index=turn_index,
                )
            )
            owners.append(turn)
    if cfg.shuffle_advantages:
        shuffle_advantages(samples, owners, seed)

    all_returns = [t.return_ for turns in groups.values() for t in turns]
    advs = [s.advantage for s in samples]
    stats = {
        "groups_total": float(len(groups)),
        "groups_kept": float(len(groups) - dropped),
        "groups_dropped": float(dropped),
        "rejected_low_coverage": float(rejected),
        "unjudged_left_out": float(unjudged_turns),
        "truncated_left_out": float(truncated),
        "samples": float(len(samples)),
        "return_mean": _mean(all_returns),
        "return_std": _std(all_returns),
        "advantage_mean": _mean(advs),
        "advantage_std": _std(advs),
        "advantage_abs_mean": _mean([abs(a) for a in advs]),
        "advantage_zero_fraction": _mean([1.0 if abs(a) < 1e-12 else 0.0 for a in advs]),
    }
    turns = [t for trajectory in trajectories for t in trajectory.turns]
    stats.update(coverage_stats(turns, cfg.min_coverage is not None or coverage_scaled_speed))
    if stats["coverage_blind"]:
        log.warning("coverage is on (learner.min_coverage / reward.coverage_scaled_speed) but none of %d correct GPU "
                    "verdicts has a measured coverage: the setting has no effect; check the profiler",
                    int(stats["coverage_gpu_correct"]))
    return samples, stats


def shuffle_advantages(samples: list[Sample], owners: list[Turn], seed: int) -> None:
    """The shuffled control: the same advantage values (so updates as large and as many as the real run's)
    given to other samples, across problems and turns, so that no update follows the reward. The turns'
    records get the values their samples trained with, so a transcript shows what was learnt from."""
    values = [s.advantage for s in samples]
    random.Random(seed).shuffle(values)
    for sample, turn, value in zip(samples, owners, values):
        sample.advantage = turn.advantage = value


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: list[float]) -> float:
    if not xs:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
