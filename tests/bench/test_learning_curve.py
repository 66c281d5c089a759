"""The learning-curve bench's statistics, and its three arms on a bandit through kforge's own credit and
learner code (the CPU run itself is bench/learning_curve.py: ~30 minutes)."""

from __future__ import annotations

import random

import pytest
import torch

from bench import learning_curve as lc
from kforge.config.schema import KforgeConfig
from kforge.credit.advantages import assign_returns, build_samples
from kforge.credit.samples import Sample
from kforge.learner.learner import Learner
from kforge.policy.records import Trajectory, Turn
from tiny_models import learner_sampling, one_thread  # noqa: F401 (autouse: one intra-op thread)

VOCAB = 16


def test_paired_test_uses_per_step_differences():
    # real beats shuffled by 0.1 to 0.3 in every step: one-sided p small, d_z = mean / sd of the differences
    real, shuffled = [0.3, 0.5, 0.6, 0.8, 0.9, 0.9], [0.2, 0.3, 0.3, 0.5, 0.7, 0.6]
    test = lc.paired_test(real, shuffled)
    d = [a - b for a, b in zip(real, shuffled)]
    mean = sum(d) / 6
    sd = (sum((x - mean) ** 2 for x in d) / 5) ** 0.5
    assert test["n"] == 6 and test["mean_diff"] == pytest.approx(mean) and test["dz"] == pytest.approx(mean / sd)
    assert test["p"] < 0.001
    # the same numbers with no pairing structure: a big spread across steps, no consistent difference
    assert lc.paired_test([0.1, 0.9, 0.1, 0.9], [0.9, 0.1, 0.9, 0.1])["p"] == pytest.approx(0.5)
    assert lc.paired_test([0.5, 0.5], [0.5, 0.5])["p"] == 1.0  # identical arms (lr 0 vs lr 0)


def test_the_tests_match_scipy():
    """The bench computes its p-values itself (a bare GPU machine may lack SciPy); they match SciPy's."""
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    for n in (3, 8, 20):
        a, b = [rng.random() for _ in range(n)], [rng.random() for _ in range(n)]
        assert lc.paired_test(a, b)["p"] == pytest.approx(stats.ttest_rel(a, b, alternative="greater").pvalue, rel=1e-9)
    for t, df in ((0.3, 3), (2.1, 5), (-1.2, 7), (30.0, 3), (0.0, 4)):
        assert lc.t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9)
    for q in ((5, 10, 1, 10), (3, 8, 3, 8), (12, 40, 4, 40)):
        table = [[q[0], q[1] - q[0]], [q[2], q[3] - q[2]]]
        assert lc.fisher_greater(*q) == pytest.approx(stats.fisher_exact(table, alternative="greater")[1], rel=1e-9)


def test_fisher_exact_one_sided():
    assert lc.fisher_greater(10, 10, 0, 10) == pytest.approx(1 / 184756)  # C(20, 10)
    assert lc.fisher_greater(0, 10, 10, 10) == 1.0


def test_shuffled_advantages_keep_the_values_and_lose_the_owners():
    samples = [Sample([1], [2], float(a)) for a in range(8)]
    lc.shuffle_advantages(samples, random.Random(0))
    advantages = [s.advantage for s in samples]
    assert sorted(advantages) == list(range(8)) and advantages != list(range(8))


# ---------------------------------------------------------------------------------------------------
# The three arms on a bandit: the reward, not the update, raises the reward


def tiny_model(seed: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config)


def make_learner(lr: float, gamma: float = 0.0) -> Learner:
    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = False
    cfg.lora.rank, cfg.lora.alpha = 4, 8
    cfg.lora.target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg.rollout.max_tokens = 8
    cfg.episode.gamma = gamma
    for key, value in dict(loss_fn="dr_grpo", learning_rate=lr, warmup_steps=0, grad_clip=1.0).items():
        setattr(cfg.learner, key, value)
    return Learner(cfg, model=tiny_model(), total_steps=10, sampling=learner_sampling(cfg))


@torch.no_grad()
def sample(learner: Learner, prompt: list[int], n: int, length: int, gen: torch.Generator):
    learner.model.eval()
    ids, logps = torch.tensor([prompt] * n), []
    for _ in range(length):
        probs = torch.softmax(learner.model(input_ids=ids).logits[:, -1].float(), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        logps.append(torch.log(probs.gather(-1, nxt)))
        ids = torch.cat([ids, nxt], dim=1)
    return ids[:, len(prompt):].tolist(), torch.cat(logps, dim=1).tolist()


TARGET, PROMPTS = 5, [[2, 7, 3], [2, 9, 4]]


def bandit_arm(arm: str, steps: int = 6, group: int = 8, length: int = 4) -> list[float]:
    """Reward 1 when the response holds TARGET. Per step, the arm's mean reward (same sampling seeds in
    every arm); samples and advantages through assign_returns / build_samples / train_step."""
    learner = make_learner(0.0 if arm == "control" else 2e-2)
    means = []
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        trajectories = []
        for k, prompt in enumerate(PROMPTS):
            responses, logps = sample(learner, prompt, group, length, gen)
            for g, (resp, lp) in enumerate(zip(responses, logps)):
                trajectories.append(Trajectory(f"p{k}", g, [Turn(0, prompt, resp, "", lp, learner.version,
                                                               score=float(TARGET in resp))]))
        means.append(sum(tr.turns[0].score for tr in trajectories) / len(trajectories))
        assign_returns(trajectories, learner.cfg.episode.gamma)
        samples, _ = build_samples(trajectories, learner.cfg.learner)
        if arm == "shuffled":
            lc.shuffle_advantages(samples, random.Random(step))
        learner.train_step(samples)
    return means


def test_real_beats_shuffled_and_lr_0_on_a_bandit():
    real, shuffled, control = (bandit_arm(arm) for arm in lc.ARMS)
    print("real", real, "shuffled", shuffled, "control", control)
    assert real[0] == shuffled[0] == control[0]  # step 1: the same weights and seeds in every arm
    assert lc.paired_test(real, shuffled)["p"] < 0.05
    assert lc.paired_test(real, control)["p"] < 0.05
    assert real[-1] > max(shuffled[-1], control[-1]) + 0.2


# ---------------------------------------------------------------------------------------------------
# Delayed credit over two turns


@torch.no_grad()
def first_turn_prob(learner: Learner, token: int) -> float:
    learner.model.eval()
    return float(torch.softmax(learner.model(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1], -1)[token])


def two_turn_run(gamma: float, steps: int = 6, group: int = 16) -> tuple[float, float]:
    """Turn 0 scores 0 whatever it says; turn 1 scores 1 only when turn 0 said TARGET (a first attempt
    that sets up the later success). Only a discounted return credits turn 0 for it."""
    learner = make_learner(5e-2, gamma)
    before = first_turn_prob(learner, TARGET)
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 + step)
        first, first_lp = sample(learner, PROMPTS[0], group, 1, gen)
        trajectories = []
        for g, (a, lp) in enumerate(zip(first, first_lp)):
            second_prompt = PROMPTS[0] + a + [11]
            b, b_lp = sample(learner, second_prompt, 1, 1, gen)
            turns = [Turn(0, PROMPTS[0], a, "", lp, learner.version, score=0.0),
                     Turn(1, second_prompt, b[0], "", b_lp[0], learner.version, score=float(a[0] == TARGET))]
            trajectories.append(Trajectory("p", g, turns))
        assign_returns(trajectories, gamma)
        samples, _ = build_samples(trajectories, learner.cfg.learner)
        learner.train_step(samples)
    return before, first_turn_prob(learner, TARGET)


def test_turn_0_learns_from_a_later_turns_reward_with_gamma_only():
    before, after = two_turn_run(gamma=0.4)
    before0, after0 = two_turn_run(gamma=0.0)
    print(f"gamma 0.4: {before:.3f} -> {after:.3f}; gamma 0: {before0:.3f} -> {after0:.3f}")
    assert before == before0
    assert after > before + 0.15  # the turn that set up the success became more likely
    # With gamma 0 turn 0's returns are all 0 and its groups are dropped: it does not learn to say TARGET
    # (the turn-1 updates move the shared weights a little, here away from it).
    assert after0 < before0 + 0.02
