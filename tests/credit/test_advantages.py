"""Returns and group advantages on a 2-problem x 3-sample x 3-turn batch, worked out by hand.

gamma = 0.5. Turn scores and the returns R_t = s_t + 0.5 * R_{t+1}:

  problem A  traj0 [0, 0, 1] -> [0.25, 0.5, 1]
             traj1 [0, 1, 1] -> [0.75, 1.5, 1]
             traj2 [1, 1, 1] -> [1.75, 1.5, 1]
  problem B  traj0 [0, 0, 0] -> [0, 0, 0]
             traj1 [0, 0, 0] -> [0, 0, 0]
             traj2 [0, 0, 2] -> [0.5, 1, 2]

Groups (problem, turn): A0 [0.25, 0.75, 1.75], A1 [0.5, 1.5, 1.5], A2 [1, 1, 1] (constant),
B0 [0, 0, 0.5], B1 [0, 0, 1], B2 [0, 0, 2].
"""

from __future__ import annotations

import pytest

from hand_batch import batch
from kforge.config.schema import LearnerConfig, RewardConfig
from kforge.credit.advantages import assign_returns, build_samples, group_advantages
from kforge.policy.records import Trajectory, Turn

RETURNS = {
    ("A", 0): [0.25, 0.5, 1.0], ("A", 1): [0.75, 1.5, 1.0], ("A", 2): [1.75, 1.5, 1.0],
    ("B", 0): [0.0, 0.0, 0.0], ("B", 1): [0.0, 0.0, 0.0], ("B", 2): [0.5, 1.0, 2.0],
}

# Advantages by group (problem, turn), members in trajectory order.
MEAN = {
    ("A", 0): [-2 / 3, -1 / 6, 5 / 6], ("A", 1): [-2 / 3, 1 / 3, 1 / 3],
    ("B", 0): [-1 / 6, -1 / 6, 1 / 3], ("B", 1): [-1 / 3, -1 / 3, 2 / 3], ("B", 2): [-2 / 3, -2 / 3, 4 / 3],
}
LEAVE_ONE_OUT = {
    ("A", 0): [-1.0, -0.25, 1.25], ("A", 1): [-1.0, 0.5, 0.5],
    ("B", 0): [-0.25, -0.25, 0.5], ("B", 1): [-0.5, -0.5, 1.0], ("B", 2): [-1.0, -1.0, 2.0],
}
# mean baseline / population std: A0 std = sqrt(7/18) = 0.623610, A1 std = sqrt(2/9) = 0.471405,
# B0 std = sqrt(1/18) = 0.235702, B1 std = sqrt(2/9), B2 std = sqrt(8/9) = 0.942809.
GRPO = {
    ("A", 0): [-1.069045, -0.267261, 1.336306], ("A", 1): [-1.414214, 0.707107, 0.707107],
    ("B", 0): [-0.707107, -0.707107, 1.414214], ("B", 1): [-0.707107, -0.707107, 1.414214],
    ("B", 2): [-0.707107, -0.707107, 1.414214],
}


def by_group(samples) -> dict[tuple[str, int], list[float]]:
    out: dict[tuple[str, int], list[float]] = {}
    for s in samples:
        out.setdefault((s.problem_key, s.turn_index), []).append(s.advantage)
    return out


def test_returns_are_discounted_sums_of_later_scores():
    trajectories = batch()
    assign_returns(trajectories, gamma=0.5)
    for traj in trajectories:
        got = [t.return_ for t in traj.turns]
        assert got == pytest.approx(RETURNS[(traj.problem_key, traj.group_index)])


def test_gamma_zero_and_one():
    trajectories = batch()
    assign_returns(trajectories, gamma=0.0)
    assert [t.return_ for t in trajectories[1].turns] == [0.0, 1.0, 1.0]
    assign_returns(trajectories, gamma=1.0)
    assert [t.return_ for t in trajectories[1].turns] == [2.0, 2.0, 1.0]


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (LearnerConfig(loss_fn="dr_grpo", advantage_baseline="mean"), MEAN),
        (LearnerConfig(loss_fn="dr_grpo", advantage_baseline="leave_one_out"), LEAVE_ONE_OUT),
        (LearnerConfig(loss_fn="grpo", advantage_baseline="mean"), GRPO),
        (LearnerConfig(loss_fn="dr_grpo", normalize_std=True), GRPO),
        (LearnerConfig(loss_fn="grpo", normalize_std=False), MEAN),
    ],
    ids=["dr_grpo-mean", "dr_grpo-loo", "grpo-std", "forced-std", "grpo-no-std"],
)
def test_advantages_per_problem_and_turn(cfg, expected):
    trajectories = batch()
    assign_returns(trajectories, gamma=0.5)
    samples, stats = build_samples(trajectories, cfg)
    got = by_group(samples)
    assert set(got) == set(expected)  # the constant group A2 is gone
    for key, values in expected.items():
        assert got[key] == pytest.approx(values, abs=1e-5)
    assert stats["groups_total"] == 6 and stats["groups_kept"] == 5 and stats["groups_dropped"] == 1
    assert stats["samples"] == 15
    flat = [a for key in expected for a in expected[key]]
    assert stats["advantage_mean"] == pytest.approx(sum(flat) / len(flat), abs=1e-5)
    # Advantages are also written back to the turns.
    assert trajectories[0].turns[0].advantage == pytest.approx(expected[("A", 0)][0], abs=1e-5)


def test_constant_groups_are_really_dropped():
    trajectories = batch()
    assign_returns(trajectories, gamma=0.5)
    samples, _ = build_samples(trajectories, LearnerConfig(remove_constant_reward_groups=True))
    assert not [s for s in samples if s.problem_key == "A" and s.turn_index == 2]

    kept, stats = build_samples(trajectories, LearnerConfig(remove_constant_reward_groups=False))
    assert len(kept) == 18 and stats["groups_dropped"] == 0
    constant = [s.advantage for s in kept if s.problem_key == "A" and s.turn_index == 2]
    assert constant == [0.0, 0.0, 0.0]


def test_all_constant_batch_gives_no_samples():
    trajectories = batch()
    for traj in trajectories:
        for turn in traj.turns:
            turn.score = 1.0
    assign_returns(trajectories, gamma=0.4)
    samples, stats = build_samples(trajectories, LearnerConfig())
    assert samples == [] and stats["groups_dropped"] == 6 and stats["advantage_mean"] == 0.0


def test_samples_carry_the_turn_data():
    trajectories = batch()
    assign_returns(trajectories, gamma=0.5)
    samples, _ = build_samples(trajectories, LearnerConfig())
    first = next(s for s in samples if s.problem_key == "B" and s.turn_index == 1)
    assert first.prompt_ids == [1, 2, 1]
    assert first.response_ids == [3, 4, 5]
    assert first.rollout_logprobs == [-0.1, -0.2, -0.3]
    assert first.policy_version == 7


def test_early_stopped_trajectories_group_by_turn_index():
    # Lengths 1, 2, 3: turn 2 has a single member (constant, dropped); turn 1 has two.
    lengths, scores = [1, 2, 3], [[1.0], [0.0, 1.0], [0.0, 0.0, 0.5]]
    trajectories = [
        Trajectory("P", g, [Turn(t, [1], [2], "", [0.0], 0, score=scores[g][t]) for t in range(n)])
        for g, n in enumerate(lengths)
    ]
    assign_returns(trajectories, gamma=1.0)
    samples, stats = build_samples(trajectories, LearnerConfig(advantage_baseline="mean"))
    got = by_group(samples)
    # turn 0 returns [1, 1, 0.5] -> mean 5/6; turn 1 returns [1, 0.5] -> mean 0.75
    assert got[("P", 0)] == pytest.approx([1 / 6, 1 / 6, -1 / 3])
    assert got[("P", 1)] == pytest.approx([0.25, -0.25])
    assert ("P", 2) not in got and stats["groups_dropped"] == 1


def test_leave_one_out_of_a_single_member_is_zero():
    assert group_advantages([3.0], "leave_one_out", normalize_std=False) == [0.0]


def _turn(index: int, score: float, coverage: float | None = None) -> Turn:
    from kforge.evaluator.verdict import Status, Verdict

    verdict = Verdict(Status.CORRECT, trials_passed=1, trials=1, coverage=coverage)
    return Turn(index=index, prompt_ids=[1, 2], response_ids=[3, 4], response_text="", logprobs=[-0.1, -0.2],
                policy_version=0, verdict=verdict, score=score)


def test_trloo_with_groups_that_shrink_as_trajectories_stop():
    """gamma 0.5. traj0 stops after turn 0 with score 1; traj1 scores [0, 1]; traj2 [0, 0].
    Returns: traj0 [1], traj1 [0.5, 1], traj2 [0, 0].
    Turn 0 (n = 3, returns 1, 0.5, 0): A = R - mean(others) = 1 - 0.25, 0.5 - 0.5, 0 - 0.75.
    Turn 1 (n = 2, returns 1, 0): A = 1 - 0, 0 - 1; the mean baseline would give only half (0.5, -0.5)."""
    trajectories = [
        Trajectory("P", 0, [_turn(0, 1.0)]),
        Trajectory("P", 1, [_turn(0, 0.0), _turn(1, 1.0)]),
        Trajectory("P", 2, [_turn(0, 0.0), _turn(1, 0.0)]),
    ]
    assign_returns(trajectories, gamma=0.5)
    cfg = LearnerConfig(loss_fn="dr_grpo", advantage_baseline="leave_one_out")
    samples, stats = build_samples(trajectories, cfg)
    by = {(s.turn_index, i): s.advantage for i, s in enumerate(samples)}
    assert [s.advantage for s in samples if s.turn_index == 0] == pytest.approx([0.75, 0.0, -0.75])
    assert [s.advantage for s in samples if s.turn_index == 1] == pytest.approx([1.0, -1.0])
    assert stats["samples"] == 5 and len(by) == 5
    mean_cfg = LearnerConfig(loss_fn="dr_grpo", advantage_baseline="mean")
    samples, _ = build_samples(trajectories, mean_cfg)
    assert [s.advantage for s in samples if s.turn_index == 1] == pytest.approx([0.5, -0.5])


def test_low_coverage_samples_are_rejected_before_grouping():
    """min_coverage 0.5: the 0.2-coverage turn is left out and counted; the group is the other three
    (returns 1, 0, 0 with gamma 0 -> mean baseline A = 2/3, -1/3, -1/3). Unmeasured coverage is kept."""
    trajectories = [
        Trajectory("P", 0, [_turn(0, 1.0, coverage=0.9)]),
        Trajectory("P", 1, [_turn(0, 5.0, coverage=0.2)]),  # a high score from a lazy kernel
        Trajectory("P", 2, [_turn(0, 0.0, coverage=None)]),
        Trajectory("P", 3, [_turn(0, 0.0, coverage=0.5)]),
    ]
    assign_returns(trajectories, gamma=0.0)
    samples, stats = build_samples(trajectories, LearnerConfig(loss_fn="dr_grpo", min_coverage=0.5))
    assert stats["rejected_low_coverage"] == 1.0 and stats["samples"] == 3
    assert [s.advantage for s in samples] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert trajectories[1].turns[0].advantage == 0.0
    # without the option the lazy kernel dominates its group
    samples, stats = build_samples(trajectories, LearnerConfig(loss_fn="dr_grpo"))
    assert stats["rejected_low_coverage"] == 0.0 and max(s.advantage for s in samples) == pytest.approx(5 - 1.5)


def test_a_turn_the_reference_failed_is_left_out_of_its_group_and_the_loss():
    """An H100 beside a busy pool: KernelBench 94's reference ran out of memory, and an honest kernel got
    `unsupported` (reference_error), about the reward of a kernel that does not compile. Such a turn says
    nothing of the answer: it is left out before grouping and counted; the group is the other three."""
    from kforge.evaluator.verdict import Status, Verdict

    spoiled = _turn(0, 0.0)
    spoiled.verdict = Verdict(Status.UNSUPPORTED, details={"reference_error": True})
    trajectories = [Trajectory("P", 0, [_turn(0, 1.0)]), Trajectory("P", 1, [spoiled]),
                    Trajectory("P", 2, [_turn(0, 0.0)]), Trajectory("P", 3, [_turn(0, 0.0)])]
    assign_returns(trajectories, gamma=0.0)
    samples, stats = build_samples(trajectories, LearnerConfig(loss_fn="dr_grpo"))
    assert stats["unjudged_left_out"] == 1.0 and stats["samples"] == 3
    assert [s.advantage for s in samples] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert trajectories[1].turns[0].advantage == 0.0


def test_coverage_that_is_never_measured_is_reported_and_warned_about(caplog):
    """The profiler gives no total (API drift): every correct GPU verdict has coverage None, so
    min_coverage and the coverage-scaled speed reward do nothing. Before, nothing said so."""
    blind = [Trajectory("P", g, [_turn(0, float(g), coverage=None)]) for g in range(3)]
    assign_returns(blind, gamma=0.0)
    with caplog.at_level("WARNING", logger="kforge.credit"):
        _, stats = build_samples(blind, LearnerConfig(loss_fn="dr_grpo", min_coverage=0.5))
    assert stats["coverage_gpu_correct"] == 3.0 and stats["coverage_measured_share"] == 0.0
    assert stats["coverage_blind"] == 1.0 and "none of 3 correct GPU verdicts" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="kforge.credit"):
        _, stats = build_samples(blind, LearnerConfig(loss_fn="dr_grpo"), RewardConfig(coverage_scaled_speed=True))
    assert stats["coverage_blind"] == 1.0 and caplog.text
    # no coverage setting on: reported, not warned about
    _, stats = build_samples(blind, LearnerConfig(loss_fn="dr_grpo"))
    assert stats["coverage_measured_share"] == 0.0 and stats["coverage_blind"] == 0.0
    # half measured: the share says so, no warning
    half = [Trajectory("P", 0, [_turn(0, 1.0, coverage=0.9)]), Trajectory("P", 1, [_turn(0, 0.0, coverage=None)])]
    assign_returns(half, gamma=0.0)
    _, stats = build_samples(half, LearnerConfig(loss_fn="dr_grpo", min_coverage=0.5))
    assert stats["coverage_measured_share"] == 0.5 and stats["coverage_blind"] == 0.0


def test_coverage_of_cpu_verdicts_is_not_counted():
    """Under the Triton interpreter (timing not meaningful) coverage is never measured: no warning there."""
    from kforge.evaluator.verdict import Status, Verdict

    turns = [_turn(0, 1.0), _turn(0, 0.0)]
    for t in turns:
        t.verdict = Verdict(Status.CORRECT, trials_passed=1, trials=1, timing_meaningful=False)
    trajectories = [Trajectory("P", g, [t]) for g, t in enumerate(turns)]
    assign_returns(trajectories, gamma=0.0)
    _, stats = build_samples(trajectories, LearnerConfig(loss_fn="dr_grpo", min_coverage=0.5))
    assert stats["coverage_gpu_correct"] == 0.0 and stats["coverage_blind"] == 0.0


def test_collapse_warnings_show_a_blind_coverage_setting():
    from kforge.train.metrics import collapse_warnings

    assert any("coverage" in w for w in collapse_warnings([], {"advantage/coverage_blind": 1.0}))
    assert not any("coverage" in w for w in collapse_warnings([], {"advantage/coverage_blind": 0.0}))
