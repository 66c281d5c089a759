"""The data-parallel LoRA learner: two gloo ranks on the CPU, each its own served process with a real Learner,
against one rank on the same batch."""

from __future__ import annotations

import pytest
import torch

from kforge.config.schema import KforgeConfig
from kforge.credit.samples import Sample
from kforge.learner.ddp import Ranks, shard_by_tokens
from kforge.train.learner_proc import LearnerProcess
from tiny_models import learner_sampling


def test_shards_cover_every_sample_once_and_balance_tokens():
    lengths = [40, 3, 17, 17, 9, 25, 1, 30]
    shards = shard_by_tokens(lengths, 3)
    assert sorted(i for s in shards for i in s) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(lengths[i] for s in shards for i in s)  # greedy bound
    assert shards == shard_by_tokens(list(lengths), 3)  # deterministic: every rank computes the same shards
    assert shard_by_tokens([5], 2) == [[0], []]  # a rank may get nothing; it still joins the all-reduce


def test_a_gpu_rank_names_its_one_visible_gpu():
    """torch.cuda.set_device and NCCL need an index; each rank's process sees only its own GPU, as cuda:0."""
    assert Ranks(None, "cuda").device == torch.device("cuda", 0) and Ranks().world == 1


def batch() -> list[Sample]:
    """Uneven lengths and both signs of advantage, over two problems and turns."""
    return [
        Sample([3, 4, 5], [6, 7], 1.0, problem_key="a"),
        Sample([3, 4, 5, 8, 9, 10, 11], [6, 7, 12, 13, 14], -1.0, problem_key="a"),
        Sample([5], [9, 9, 9], 0.5, problem_key="b", turn_index=1),
        Sample([4, 4], [10], -0.5, problem_key="b", turn_index=1),
        Sample([3, 9, 9, 4], [11, 12, 13, 14, 15, 6], 0.75, problem_key="c"),
        Sample([7, 7], [8, 3, 5], -0.25, problem_key="c"),
        Sample([6], [4, 4, 4, 4], 0.3, problem_key="d", turn_index=1),
    ]


def cfg_for(loss_fn: str, aggregation: str) -> KforgeConfig:
    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = False
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout = 4, 8, 0.0
    cfg.rollout.max_tokens = 8
    lc = cfg.learner
    lc.loss_fn, lc.loss_aggregation = loss_fn, aggregation
    lc.learning_rate, lc.grad_clip, lc.warmup_steps = 1e-2, 1e6, 0
    lc.num_substeps, lc.micro_batch_tokens, lc.kl_coef = 2, 12, 0.05  # several micro-batches per rank
    lc.call_timeout_s = 300
    return cfg


def states(proc: LearnerProcess) -> list[dict]:
    return [p.call("lora_state", timeout_s=120) for p in proc._procs]


LOSSES = [("grpo", "token_mean"), ("dr_grpo", "token_mean"), ("grpo", "sequence_mean")]


@pytest.mark.slow  # two gloo ranks and a one-rank run train on the CPU: about 30 s
def test_two_gloo_ranks_give_the_one_rank_gradients_and_update(tmp_path):
    """Same batches, one rank vs two: every LoRA gradient of the last minibatch and every adapter weight after
    each pair of steps agree to float tolerance, on both ranks, under every normaliser (total response tokens;
    total sequences, as dr_grpo's constant budget and as a sequence mean); the metrics that sum over the batch
    agree too. Each rank draws a different random adapter at start (fake_parts.TinyLearner), so rank 1 matches
    only because the group starts from rank 0's."""
    cfg = cfg_for(*LOSSES[0])
    results = {}
    for world in (1, 2):
        proc = LearnerProcess(cfg, [], total_steps=len(LOSSES) * 2, sampling=learner_sampling(cfg),
                              factory="fake_parts:TinyLearner",
                              cpu_ranks=world, log_path=str(tmp_path / f"learner-{world}.log"), start_timeout_s=600)
        try:
            assert proc.ranks == world
            after, metrics = [states(proc)], []
            for loss in LOSSES:
                for p in proc._procs:
                    p.call("set_loss", loss_fn=loss[0], aggregation=loss[1], timeout_s=60)
                metrics += [proc.train_step(batch()) for _ in range(2)]
                after.append(states(proc))
            results[world] = (after, metrics, proc.version)
        finally:
            proc.close()
    one_after, one_metrics, one_version = results[1]
    two_after, two_metrics, two_version = results[2]
    assert one_version == two_version == 2 * len(LOSSES)
    names = sorted(one_after[0][0])
    assert names
    for stage, ((one,), two) in enumerate(zip(one_after, two_after)):
        for rank, rank_state in enumerate(two):
            assert sorted(rank_state) == names
            for name in names:
                weight, grad = rank_state[name]
                torch.testing.assert_close(weight, one[name][0], rtol=1e-4, atol=1e-6,
                                           msg=lambda m: f"stage {stage} rank {rank} {name}: {m}")  # noqa: B023 (called at once)
                if one[name][1] is None:
                    assert grad is None, name
                else:
                    # Summing in another order moves the last bits; a wrong normaliser or a missed rank is off by 1/2.
                    scale = float(one[name][1].abs().max())
                    torch.testing.assert_close(grad, one[name][1], rtol=1e-3, atol=1e-4 * scale,
                                               msg=lambda m: f"stage {stage} rank {rank} {name}: {m}")  # noqa: B023 (called at once)
    for k in range(1, len(one_after)):  # every stage moved every LoRA weight: the comparison is not vacuous
        (before,), (now,) = one_after[k - 1], one_after[k]
        assert all(not torch.equal(before[n][0], now[n][0]) and now[n][1].abs().sum() > 0 for n in names), k
    for m1, m2 in zip(one_metrics, two_metrics):
        for key in ("loss", "kl", "grad_norm", "tokens", "response_tokens", "samples", "optimizer_steps"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-7), key
