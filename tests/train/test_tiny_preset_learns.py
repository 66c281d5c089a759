"""The tiny preset's run trains: a step of what SmolLM2-135M writes (no kernel, some answers cut at
max_tokens) has groups that differ, so the learner takes an optimiser step, the adapter moves away from
where it started and the KL to the start grows. Before, every group of such a step had the same return
(0): no sample, `learner/skipped` = 1, the exported adapter equal to the initial one."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.config.loader import resolve
from kforge.credit.advantages import assign_returns, build_samples
from kforge.credit.rewards import score_trajectories
from kforge.policy.records import Candidate, Trajectory, Turn
from tiny_models import LEARNER_VOCAB as VOCAB
from tiny_models import make_learner, one_thread, tiny_model  # noqa: F401 (one_thread: autouse, one intra-op thread)


def small_model_turn(problem: str, index: int, tokens: int, max_tokens: int, seed: int) -> Turn:
    """A response with no kernel block, ``tokens`` long (cut when it reaches max_tokens), its ids inside
    the scratch model's vocabulary and its text its own (prose differs from sample to sample)."""
    ids = [3 + (seed * 7 + k) % (VOCAB - 3) for k in range(tokens)]
    return Turn(index, [3, 4, 5 + index], ids, f"sample {problem} {seed} " + "words " * tokens, [-1.0] * tokens, 0,
                candidate=Candidate(problem, None, parse_error="no <KERNEL> block"), truncated=tokens >= max_tokens)


def tiny_step(cfg, seed: int) -> list[Trajectory]:
    """2 problems x group_size samples x 2 turns; about two answers in three are cut, as measured."""
    max_tokens = cfg.rollout.max_tokens
    lengths = [max_tokens, 40, max_tokens, 90, max_tokens, max_tokens, 70, max_tokens]
    out, k = [], 0
    for problem in ("1/3", "1/4"):
        for g in range(cfg.dataset.group_size):
            turns = []
            for index in range(cfg.turns):
                turns.append(small_model_turn(problem, index, lengths[(k + seed) % len(lengths)], max_tokens, seed * 100 + k))
                k += 1
            out.append(Trajectory(problem, g, turns=turns))
    return out


def credit(cfg, trajectories):
    score_trajectories(trajectories, cfg.reward, cfg.episode.thinking)
    assign_returns(trajectories, cfg.episode.gamma)
    return build_samples(trajectories, cfg.learner, cfg.reward)


def test_the_tiny_reward_separates_an_answer_that_ends_from_one_cut_at_max_tokens():
    cfg = resolve(preset="tiny").config
    step = tiny_step(cfg, 0)
    samples, stats = credit(cfg, step)
    assert samples and stats["groups_kept"] > 0
    cut = [t.score for tr in step for t in tr.turns if t.truncated]
    ended = [t.score for tr in step for t in tr.turns if not t.truncated]
    assert cut and ended and max(cut) < min(ended) and max(ended) <= 0.0


def test_a_fixed_non_answer_repeated_across_problems_gets_the_floor():
    """The length tie-breaker must not become the template hole again: the same short text on every
    problem is a template, not an answer that finished within the budget."""
    cfg = resolve(preset="tiny").config
    step = tiny_step(cfg, 0)
    for tr in step:
        if tr.group_index == 0:
            tr.turns[0] = Turn(0, [3], [4] * 5, "I cannot help with that.", [-1.0] * 5, 0,
                               candidate=Candidate(tr.problem_key, None))
    stats = score_trajectories(step, cfg.reward, cfg.episode.thinking)
    fixed = [tr.turns[0] for tr in step if tr.group_index == 0]
    assert [t.reward_components["length"] for t in fixed] == [-cfg.reward.length_weight] * 2
    assert stats["template_turns"] == 2.0


def test_tiny_learner_steps_move_the_adapter_and_the_kl():
    cfg = resolve(preset="tiny").config
    learner = make_learner(cfg, model=tiny_model())
    start = {n: p.detach().clone() for n, p in learner.model.named_parameters() if "lora_" in n}
    metrics = []
    for seed in range(3):
        samples, _ = credit(cfg, tiny_step(cfg, seed))
        metrics.append(learner.train_step(samples))
    assert all(m["skipped"] == 0.0 and m["optimizer_steps"] >= 1 for m in metrics), metrics
    assert all(math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in metrics)
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-9)  # the adapter starts as the reference
    assert metrics[2]["kl"] > 0.0
    assert len({round(m["loss"], 9) for m in metrics}) == 3
    moved = [n for n, p in learner.model.named_parameters() if "lora_B" in n and not torch.equal(p, start[n])]
    assert moved, "no LoRA weight changed"
