"""`learner.shuffle_advantages`: the shuffled control keeps the step's advantage values (update sizes) and
gives them to other samples, so the update no longer follows the reward."""

from __future__ import annotations

import pytest

from hand_batch import batch
from kforge.config.loader import resolve
from kforge.credit.advantages import assign_returns, build_samples


def _samples(shuffle: bool, seed: int):
    cfg = resolve("tiny", None, [f"learner.shuffle_advantages={str(shuffle).lower()}", "learner.loss_fn=ppo"]).config
    trajectories = batch()
    assign_returns(trajectories, gamma=0.5)
    samples, stats = build_samples(trajectories, cfg.learner, seed=seed)
    return samples, stats, trajectories


def test_the_key_defaults_off_and_is_read_from_overrides():
    assert resolve("tiny", None, []).config.learner.shuffle_advantages is False
    assert resolve("tiny", None, ["learner.shuffle_advantages=true"]).config.learner.shuffle_advantages is True


def test_shuffled_advantages_are_the_same_values_on_other_samples():
    real, real_stats, _ = _samples(False, seed=3)
    moved = 0
    for seed in range(5):
        shuffled, stats, trajectories = _samples(True, seed=seed)
        # Same samples (prompts, responses, order), same multiset of advantages: same step sizes.
        assert [(s.problem_key, s.turn_index, s.response_ids) for s in shuffled] == \
            [(s.problem_key, s.turn_index, s.response_ids) for s in real]
        assert sorted(s.advantage for s in shuffled) == pytest.approx(sorted(s.advantage for s in real))
        assert stats["advantage_abs_mean"] == pytest.approx(real_stats["advantage_abs_mean"])
        moved += sum(abs(a.advantage - b.advantage) > 1e-9 for a, b in zip(shuffled, real))
        # The transcript's turns record what their samples were trained with.
        kept = [t.advantage for tr in trajectories for t in tr.turns if t.advantage != 0.0]
        assert sorted(kept) == pytest.approx(sorted(s.advantage for s in shuffled if s.advantage != 0.0))
    assert moved > 0.5 * 5 * len(real)  # most samples get another sample's advantage


def test_the_permutation_is_fixed_by_the_seed():
    a, _, _ = _samples(True, seed=11)
    b, _, _ = _samples(True, seed=11)
    c, _, _ = _samples(True, seed=12)
    assert [s.advantage for s in a] == [s.advantage for s in b]
    assert [s.advantage for s in a] != [s.advantage for s in c]


def test_the_trainer_credit_step_shuffles_with_the_step_seed():
    """The trainer's credit step reads the key and seeds the permutation by (run seed, step): every step
    draws its own permutation, and a resumed run redraws the same one."""
    from types import SimpleNamespace

    from kforge.evaluator.verdict import Status, Verdict
    from kforge.train.trainer import Trainer

    def trajectories():
        out = batch()
        for tr in out:  # correct where the hand-made score is positive, incorrect otherwise
            for t in tr.turns:
                t.verdict = Verdict(Status.CORRECT if t.score > 0 else Status.INCORRECT, trials=2)
        return out

    def credit(shuffle: bool, step: int):
        cfg = resolve("tiny", None, [f"learner.shuffle_advantages={str(shuffle).lower()}"]).config
        samples, _ = Trainer._credit(SimpleNamespace(cfg=cfg, step=step), trajectories())
        return [s.advantage for s in samples]

    real = credit(False, 0)
    assert credit(False, 1) == real  # the real advantages do not depend on the step
    step0, step1 = credit(True, 0), credit(True, 1)
    assert sorted(step0) == pytest.approx(sorted(real)) and step0 != real
    assert step0 == credit(True, 0) and step0 != step1
